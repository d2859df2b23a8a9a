package registrysync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
)

// Subject is the object a volume's sync Events go on: its claim, or the
// pod of a CSI inline volume.
type Subject interface {
	runtime.Object
	GetNamespace() string
	GetName() string
}

// subjectName names a volume's subject in messages: "claim ci/cache",
// "pod ci/build".
func subjectName(o Subject) string {
	kind := "claim"
	if _, ok := o.(*corev1.Pod); ok {
		kind = "pod"
	}
	return kind + " " + o.GetNamespace() + "/" + o.GetName()
}

// Pull brings the node's copy of the cache up to its published chain
// before a volume mounts it, within the class's sync timeout and the
// volume's layer bound. It never fails the volume: past the timeout, or
// when the registry fails, a layer is too large or the chain is not
// trusted, the volume mounts what the node has, and an Event on its
// subject (its claim, or its CSI volume's pod) says so.
func (s *Syncer) Pull(ctx context.Context, subject Subject, req kit.VolumeRequest) {
	ref, reg := req.Cache, req.Registry
	logger := log.FromContext(ctx).WithValues("cache", ref.String())
	ctx, cancel := context.WithTimeout(ctx, reg.SyncTimeout)
	defer cancel()
	start := time.Now()
	var res layerfs.SyncResult
	var cache *v1alpha1.Cache
	err := s.prepare(ctx, subject.GetNamespace(), req)
	if err == nil {
		res, cache, err = s.syncTo(ctx, ref, reg)
	}
	if err == nil {
		res, cache, err = s.catchUp(ctx, subject, req, cache, res)
	}
	if err != nil {
		s.pullFailed(ctx, subject, req, cache, err)
		return
	}
	if res.Fetched > 0 {
		s.metrics.RegistryLayers.WithLabelValues("pull").Add(float64(res.Fetched))
		s.metrics.RegistryBytes.WithLabelValues("pull").Add(float64(res.FetchedBytes))
		s.metrics.RegistrySeconds.WithLabelValues("pull").Observe(time.Since(start).Seconds())
		logger.Info("Pulled", "registry", cache.Status.Published.Repository, "layers", res.Fetched, "bytes", res.FetchedBytes,
			"generation", res.Generation, "seconds", time.Since(start).Seconds())
	}
}

// catchUp waits for the layers other nodes announced (see announce.go)
// and takes them in, leaving part of the sync timeout for the pull of
// what arrives. An announced layer that does not arrive in time is a
// SyncIncomplete Event that names it; the volume mounts without it.
func (s *Syncer) catchUp(ctx context.Context, subject Subject, req kit.VolumeRequest, cache *v1alpha1.Cache, res layerfs.SyncResult) (layerfs.SyncResult, *v1alpha1.Cache, error) {
	waitCtx, cancel := context.WithTimeout(ctx, req.Registry.SyncTimeout*3/4)
	latest, missing := s.awaitAnnounced(waitCtx, cache)
	cancel()
	if len(missing) > 0 {
		s.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonSyncIncomplete, kit.ActionPull,
			"node %s mounts cache %s without the announced %s; later builds get it once it is published (%s: %s)",
			s.node, req.Cache, missing, kit.ParamSyncTimeout, req.Registry.SyncTimeout)
		log.FromContext(ctx).Info("Announced layers did not arrive; mounting without them", "cache", req.Cache.String(), "missing", missing.String())
	}
	if latest == cache || latest.Status.Published.Generation == cache.Status.Published.Generation {
		return res, cache, nil
	}
	more, latest, err := s.syncTo(ctx, req.Cache, req.Registry)
	more.Changed = more.Changed || res.Changed
	more.Fetched += res.Fetched
	more.FetchedBytes += res.FetchedBytes
	return more, latest, err
}

// pullFailed reports a pull that failed; the volume mounts what the node
// has. cache is the Cache as the pull read it, if it did.
func (s *Syncer) pullFailed(ctx context.Context, subject Subject, req kit.VolumeRequest, cache *v1alpha1.Cache, err error) {
	ref, reg := req.Cache, req.Registry
	logger := log.FromContext(ctx).WithValues("cache", ref.String())
	where := "the cache's registry"
	if cache != nil && cache.Status.Published != nil {
		where = cache.Status.Published.Repository
	}
	var untrusted *untrustedError
	switch {
	case errors.As(err, &untrusted):
		s.metrics.Fail(kit.OpPull, kit.FailureUntrusted)
		msg := fmt.Sprintf("node %s fetched nothing for cache %s and the volume mounts what the node has: %v", s.node, ref, err)
		s.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonUntrustedChain, kit.ActionPull, "%s", msg)
		if cache != nil {
			s.events.Eventf(cache, nil, corev1.EventTypeWarning, kit.ReasonUntrustedChain, kit.ActionPull,
				"node %s refused to pull for %s: %v; fix status.published or the StorageClasses", s.node, subjectName(subject), err)
		}
		logger.Info("Published chain refused; mounting what the node has", "err", err.Error())
	case errors.Is(err, layerfs.ErrInvalidImage):
		s.metrics.Fail(kit.OpPull, kit.FailureInvalidImage)
		s.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonUntrustedChain, kit.ActionPull, "%s", invalidImageMessage(s.node, ref, err))
		logger.Info("Layer image refused; mounting what the node has", "err", err.Error())
	case errors.Is(err, layerfs.ErrTooLarge):
		s.metrics.Fail(kit.OpPull, kit.FailureTooLarge)
		s.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonLayerTooLarge, kit.ActionPull, "%s", tooLargeMessage(ref, s.node, reg, cache, err))
		logger.Info("Layer too large; mounting what the node has", "err", err.Error())
	case ctx.Err() != nil:
		s.metrics.Fail(kit.OpPull, "timeout")
		s.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonSyncIncomplete, kit.ActionPull,
			"the layers of cache %s that node %s lacks did not arrive from %s within the StorageClass's %s of %s, so the volume mounts what the node has (a colder cache); raise %s if builds wait for it gladly: %v",
			ref, s.node, where, kit.ParamSyncTimeout, reg.SyncTimeout, kit.ParamSyncTimeout, err)
		logger.Info("Pull incomplete; mounting what the node has", "err", err.Error())
	default:
		s.metrics.Fail(kit.OpPull, FailureReason(err))
		s.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonRegistryFailed, kit.ActionPull,
			"could not bring cache %s up to date from %s, so the volume mounts what node %s has: %v", ref, where, s.node, err)
		logger.Error(err, "Pull failed; mounting what the node has")
	}
}

// tooLargeMessage tells which layer passed which bound, and how to lift
// it.
func tooLargeMessage(ref layerfs.CacheRef, node string, bounds *kit.RegistryRef, cache *v1alpha1.Cache, err error) string {
	what := "a layer"
	if cache != nil && cache.Status.Published != nil {
		for _, l := range cache.Status.Published.Layers {
			if bounds.MaxLayerBytes > 0 && l.Size > bounds.MaxLayerBytes {
				what = fmt.Sprintf("layer %s (%s)", l.Digest, v1alpha1.FormatSize(l.Size))
				break
			}
			if l.IndexSize > maxIndexBytes(bounds.MaxLayerBytes) {
				what = fmt.Sprintf("the index of layer %s (%s)", l.Digest, v1alpha1.FormatSize(l.IndexSize))
				break
			}
		}
	}
	fix := fmt.Sprintf("raise parameter %s of StorageClass %q", kit.ParamMaxLayerSize, bounds.Class)
	if bounds.BoundFrom == kit.BoundFromClaim {
		fix = fmt.Sprintf("raise the claim's storage request, or set parameter %s on StorageClass %q", kit.ParamMaxLayerSize, bounds.Class)
	}
	return fmt.Sprintf("%s of cache %s is larger than the bound of %s (%s), so node %s did not keep it and the volume mounts what the node has; %s: %v",
		what, ref, v1alpha1.FormatSize(bounds.MaxLayerBytes), bounds.BoundFrom, node, fix, err)
}

// syncTo makes the node's head the Cache's published chain, under the
// cache's lock, within the bounds of bounds. The chain is read under the
// lock: one read before it could predate a layer this node appended
// meanwhile, and a Sync to it would drop that layer from the head. It is
// checked there too, so the chain checked is the chain used. It returns
// the Cache it read; nothing is synced when it has no chain with layers.
func (s *Syncer) syncTo(ctx context.Context, ref layerfs.CacheRef, bounds *kit.RegistryRef) (layerfs.SyncResult, *v1alpha1.Cache, error) {
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return layerfs.SyncResult{}, nil, err
	}
	defer unlock()
	cache, err := s.caches.Live(ctx, ref)
	if err != nil || cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil || len(cache.Status.Published.Layers) == 0 {
		return layerfs.SyncResult{}, cache, err
	}
	reg, err := s.checkChain(ctx, cache)
	if err != nil {
		return layerfs.SyncResult{}, cache, err
	}
	if err := checkIndexBounds(ref, cache.Status.Published, bounds.MaxLayerBytes); err != nil {
		return layerfs.SyncResult{}, cache, err
	}
	target, err := s.target(ctx, reg)
	if err != nil {
		return layerfs.SyncResult{}, cache, err
	}
	opts := syncOptions(target, bounds)
	opts.Layout = bounds.Layout
	res, err := s.store.Sync(ctx, ref, chainOf(cache.Status.Published), fetchFrom(target), opts)
	if res.NeedsSquash {
		s.squashes.Add(ref)
	}
	return res, cache, err
}

// checkChain checks the Cache's chain (see trust) and returns the
// registry it may be used with.
func (s *Syncer) checkChain(ctx context.Context, cache *v1alpha1.Cache) (*kit.RegistryRef, error) {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	var applied int64
	info, err := s.store.Inspect(ctx, ref)
	switch {
	case err == nil:
		applied = info.Generation
	case !errors.Is(err, layerfs.ErrNotFound):
		return nil, fmt.Errorf("read cache %s on node %s to check its chain: %w", ref, s.node, err)
	}
	var age time.Duration
	if !cache.CreationTimestamp.IsZero() {
		age = time.Since(cache.CreationTimestamp.Time)
	}
	return s.trust.check(ref, cache.Status.Published, chainCheck{applied: applied, age: age})
}

func chainOf(pub *v1alpha1.PublishedChain) layerfs.Chain {
	c := layerfs.Chain{Generation: pub.Generation}
	for _, l := range pub.Layers {
		// The trust check refused a chain with another media type; a layer
		// of one would be refused by Sync too (ErrInvalidImage).
		format := layerfs.LayerFormat(l.MediaType)
		if remote.IsImage(l.MediaType) {
			format = layerfs.FormatEROFS
		}
		c.Layers = append(c.Layers, layerfs.ChainLayer{Digest: l.Digest, Size: l.Size, Format: format, Covers: l.Covers,
			DiffID: l.DiffID, Index: l.Index, IndexSize: l.IndexSize})
	}
	return c
}

// fetchFrom fetches chain layers from target, no further than the size
// the chain states.
func fetchFrom(target *remote.Target) layerfs.Fetch {
	return func(ctx context.Context, l layerfs.ChainLayer) (io.ReadCloser, error) {
		return target.Fetch(ctx, l.Digest, l.Size)
	}
}
