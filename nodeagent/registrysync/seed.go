package registrysync

import (
	"context"
	"errors"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
)

// Seeding across nodes. A cache of a registry class that has no
// generation anywhere (none on this node, no published chain with
// layers) starts from the first of its fallbacks that has a head on this
// node or a published chain the node trusts. The node pulls that
// fallback as a read claim of it would (syncTo: the owner's repository
// and Secret, checked against the classes), then layerfs seeds the
// volume from its head. The seeded layers keep the fallback's blobs
// (LayerInfo.MountFrom), and the seeded cache's first publish mounts
// them into its own repository (publishSeed), so its chain names only
// blobs of its own repository, the fallback's digests unchanged.

// Seed returns the fallbacks the volume of req may start from (at most
// one: the one pulled) and the repositories their digests live in; a
// failed pull is an Event on subject. The volume's own pull has run: a
// cache with a generation anywhere, or whose state cannot be read,
// ignores its fallbacks (a cache that exists on another node must sync,
// never restart from a fallback).
func (s *Syncer) Seed(ctx context.Context, subject Subject, req kit.VolumeRequest) ([]layerfs.CacheRef, map[layerfs.CacheRef]string) {
	if len(req.Fallbacks) == 0 {
		return nil, nil
	}
	logger := log.FromContext(ctx).WithValues("cache", req.Cache.String())
	if has, err := s.hasGeneration(ctx, req.Cache); has || err != nil {
		if err != nil {
			logger.Error(err, "Cannot tell whether the cache exists; its fallbacks are ignored")
		}
		return nil, nil
	}
	for _, f := range req.Fallbacks {
		repo, ok := s.pullFallback(ctx, subject, req, f)
		if !ok {
			continue
		}
		if repo == "" {
			return []layerfs.CacheRef{f}, nil
		}
		return []layerfs.CacheRef{f}, map[layerfs.CacheRef]string{f: repo}
	}
	return nil, nil
}

// hasGeneration tells whether ref has a generation on this node or a
// published chain with layers.
func (s *Syncer) hasGeneration(ctx context.Context, ref layerfs.CacheRef) (bool, error) {
	local, err := s.localGeneration(ctx, ref)
	if err != nil || local {
		return local, err
	}
	cache, err := s.caches.Live(ctx, ref)
	if err != nil {
		return false, err
	}
	return cache != nil && cache.Status.Published != nil && len(cache.Status.Published.Layers) > 0, nil
}

func (s *Syncer) localGeneration(ctx context.Context, ref layerfs.CacheRef) (bool, error) {
	info, err := s.store.Inspect(ctx, ref)
	if errors.Is(err, layerfs.ErrNotFound) {
		return false, nil
	}
	return err == nil && (info.Generation > 0 || len(info.Layers) > 0), err
}

// pullFallback brings fallback f up to its published chain, if it has
// one the node trusts, and tells whether f now has a generation here,
// with the repository its layers' digests live in ("" when it has no
// trusted chain: its head's digests then name nothing the seeded cache
// may mount).
func (s *Syncer) pullFallback(ctx context.Context, subject Subject, req kit.VolumeRequest, f layerfs.CacheRef) (string, bool) {
	logger := log.FromContext(ctx).WithValues("cache", req.Cache.String(), "fallback", f.String())
	repo := ""
	cache, err := s.caches.Live(ctx, f)
	if err != nil {
		logger.Error(err, "Read the fallback's Cache; trying what the node has")
	}
	if cache != nil && cache.DeletionTimestamp == nil && cache.Status.Published != nil && len(cache.Status.Published.Layers) > 0 {
		if reg, err := s.checkChain(ctx, cache); err == nil {
			repo = reg.Repository
			// As a read claim of f pulls it: within the volume's class's
			// timeout and bounds, reporting failures on its subject.
			s.Pull(ctx, subject, kit.VolumeRequest{Cache: f, Mode: v1alpha1.ModeRead, Registry: req.Registry})
		} else {
			logger.Info("Fallback's published chain not trusted; not pulled", "err", err.Error())
		}
	}
	local, err := s.localGeneration(ctx, f)
	if err != nil {
		logger.Error(err, "Read the fallback on this node")
	}
	return repo, local
}

// seedSource is a fallback's published blob that a seeded layer may be
// mounted from.
type seedSource struct {
	repository string // the fallback's, as its chain names it
	from       *remote.Target
	blob       remote.Blob
}

// seedSources are the blobs of the chain of the fallback info was seeded
// from, by digest, if the seeded cache has layers that keep them
// (MountFrom) and the fallback's chain passes the rules a read of it
// must: a reader grant for another namespace, a Cache not being deleted,
// a chain the node trusts. Layers whose blob is not among them are
// exported and pushed, as any layer.
func (s *Syncer) seedSources(ctx context.Context, ref layerfs.CacheRef, info layerfs.CacheInfo, pending []layerfs.LayerInfo) map[string]seedSource {
	if info.SeededFrom == nil || !hasMountFrom(pending) {
		return nil
	}
	f := info.SeededFrom.Cache
	logger := log.FromContext(ctx).WithValues("cache", ref.String(), "fallback", f.String())
	var cache *v1alpha1.Cache
	var err error
	if f.Namespace != ref.Namespace {
		cache, err = s.caches.AuthorizeRead(ctx, ref.Namespace, f)
	} else {
		cache, err = s.caches.Live(ctx, f)
	}
	if err != nil || cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil {
		logger.Info("Fallback not readable now; its layers are pushed, not mounted", "err", errString(err))
		return nil
	}
	reg, err := s.checkChain(ctx, cache)
	if err == nil {
		var from *remote.Target
		if from, err = s.target(ctx, reg); err == nil {
			out := map[string]seedSource{}
			for _, l := range cache.Status.Published.Layers {
				out[l.Digest] = seedSource{repository: reg.Repository, from: from, blob: blobOf(l)}
			}
			return out
		}
	}
	logger.Info("Fallback's chain cannot be used; its layers are pushed, not mounted", "err", err.Error())
	return nil
}

func hasMountFrom(layers []layerfs.LayerInfo) bool {
	for _, l := range layers {
		if l.MountFrom != "" {
			return true
		}
	}
	return false
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
