package registrysync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
)

// errPublishBlocked is a publish skipped because its oldest pending layer
// cannot be published and nothing changed since that was reported.
var errPublishBlocked = errors.New("the oldest unpublished layer cannot be published; waiting for a commit or squash")

// Publish pushes the cache's unpublished layers, oldest first, appends
// each to the Cache's chain, then takes in the layers other nodes appended
// meanwhile, so that every node converges on the same chain. Registry
// failures are retried with backoff by the queue and by the periodic
// pass; the layers stay on the node until they are pushed. A layer that
// cannot be published is reported once and not retried until a commit
// or a squash changes the node's pending layers: retrying the same
// export cannot help.
func (s *Syncer) Publish(ctx context.Context, ref layerfs.CacheRef) error {
	cache, err := s.caches.Live(ctx, ref)
	if err != nil || cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil {
		return err
	}
	err = s.publishTo(ctx, cache)
	var unpublishable *unpublishableError
	switch {
	case errors.Is(err, errPublishBlocked):
		return nil
	case errors.As(err, &unpublishable):
		s.metrics.Fail(kit.OpPush, kit.FailureUnpublishable)
		s.failed(cache, err)
		// It holds back every later layer too, until a commit or a squash.
		return s.withdraw(ctx, layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}, func(a v1alpha1.AnnouncedLayer) bool { return s.settled(ctx, a) }, unpublishable.Error())
	case err != nil:
		s.metrics.Fail(kit.OpPush, FailureReason(err))
		s.failed(cache, err)
		return err
	}
	s.recovered(cache)
	return nil
}

func (s *Syncer) publishTo(ctx context.Context, cache *v1alpha1.Cache) error {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	info, err := s.store.Inspect(ctx, ref)
	if errors.Is(err, layerfs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	reg, err := s.checkChain(ctx, cache)
	if err != nil {
		return err
	}
	pending := unpublished(info)
	if len(pending) == 0 && len(announcedBy(cache.Status.Published, s.node)) > 0 {
		// Announced before a restart, then squashed into published layers
		// or lost with the node's store; commits in flight keep theirs.
		if err := s.withdraw(ctx, ref, func(a v1alpha1.AnnouncedLayer) bool { return s.settled(ctx, a) }, "the node has no unpublished layers for it"); err != nil {
			return err
		}
	}
	if s.blocked(ref, pending) {
		return errPublishBlocked
	}
	target, err := s.target(ctx, reg)
	if err != nil {
		return err
	}
	gone := s.goneNodes(ctx, cache.Status.Published.Announced)
	// A seeded cache's first publish (nothing of it published yet, or
	// its seeded layers still keep the fallback's blobs): its layers go
	// into the chain in one update, so no node ever sees part of the
	// seed as the cache.
	seeded := info.SeededFrom != nil && (len(pending) == len(info.Layers) || hasMountFrom(pending))
	sources := s.seedSources(ctx, ref, info, pending)
	pub, err := s.pushPending(ctx, ref, reg, target, pending, gone, cache.Status.Published, seeded, sources)
	if err != nil || pub == nil {
		return err
	}
	squashed, err := s.publishSquashes(ctx, ref, reg, target, info, pub)
	if err != nil {
		return err
	}
	if squashed != nil {
		pub = squashed
	}
	if info.Layout == layerfs.LayoutSnapshot {
		folded, err := s.foldSnapshotChain(ctx, ref, reg, pub)
		if err != nil {
			return err
		}
		if folded != nil {
			pub, squashed = folded, folded
		}
	}
	_, synced, err := s.syncTo(ctx, ref, reg)
	if err != nil {
		return fmt.Errorf("take in the layers other nodes published: %w", err)
	}
	if synced != nil && synced.Status.Published != nil {
		pub = synced.Status.Published
	}
	if len(pending) > 0 || squashed != nil {
		digest, err := target.PushManifest(ctx, BlobsBaseFirst(pub))
		if err != nil {
			// The chain is in the Cache and the blobs are in the registry;
			// the manifest only tags them, and the next publish retries it.
			log.FromContext(ctx).Error(err, "Push the cache's manifest", "cache", ref.String())
		} else {
			s.UnpushIfDeleting(ctx, ref, target, digest)
		}
	}
	s.reports.Add(ref)
	return nil
}

// pushPending pushes the pending layers in order and returns the chain
// as written; nil if the Cache went away. Order matters: a layer was
// built on the ones below it, and the node keeps its unpublished layers
// on top of the chain, so a layer published past an older unpublished
// one would end up below it on this node. A layer that cannot be
// published therefore holds back the ones after it.
//
// Each layer is appended as it is pushed, except in a seeded cache's
// first publish (batch): there the fallback's layers and the build's are
// one commit, appended together once all blobs are in the repository.
// Part of them in the chain would be a generation that never existed,
// and a node that pulled it would mount half a seed.
func (s *Syncer) pushPending(ctx context.Context, ref layerfs.CacheRef, reg *kit.RegistryRef, target *remote.Target, pending []layerfs.LayerInfo, gone []string, pub *v1alpha1.PublishedChain, batch bool, sources map[string]seedSource) (*v1alpha1.PublishedChain, error) {
	var held []pushed
	for i, layer := range pending {
		p, err := s.putBlob(ctx, ref, target, layer, sources)
		if errors.Is(err, layerfs.ErrUnpublishable) {
			s.markStuck(ref, pending)
			return nil, &unpublishableError{cache: ref, layer: layer.ID, held: len(pending) - i - 1, err: err}
		}
		if err != nil || p == nil {
			return nil, err
		}
		if held = append(held, *p); batch && i < len(pending)-1 {
			continue
		}
		next, err := s.appendPushed(ctx, ref, reg, held, gone)
		if err != nil || next == nil {
			return nil, err
		}
		pub, held = next, nil
	}
	return pub, nil
}

// unpublishableError is a layer whose export fails in a way that retrying
// cannot fix (layerfs.ErrUnpublishable names the path and why).
type unpublishableError struct {
	cache layerfs.CacheRef
	layer string
	held  int // later layers it holds back
	err   error
}

func (e *unpublishableError) Error() string {
	return fmt.Sprintf("layer %s of cache %s cannot be published: %v", e.layer, e.cache, e.err)
}

func (e *unpublishableError) Unwrap() error { return e.err }

// pendingKey identifies a set of pending layers: a commit or a squash
// changes it.
func pendingKey(pending []layerfs.LayerInfo) string {
	ids := make([]string, len(pending))
	for i, l := range pending {
		ids[i] = l.ID
	}
	return strings.Join(ids, ",")
}

func (s *Syncer) markStuck(ref layerfs.CacheRef, pending []layerfs.LayerInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stuck[ref] = pendingKey(pending)
}

// blocked tells whether the cache's pending layers are those a layer that
// cannot be published held back last time.
func (s *Syncer) blocked(ref layerfs.CacheRef, pending []layerfs.LayerInfo) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, ok := s.stuck[ref]
	return ok && key == pendingKey(pending)
}

// needsPublish tells whether the node has layers or a squash to publish.
func needsPublish(info layerfs.CacheInfo, pub *v1alpha1.PublishedChain) bool {
	if len(unpublished(info)) > 0 {
		return true
	}
	return slices.ContainsFunc(info.Layers, func(l layerfs.LayerInfo) bool {
		return l.Digest == "" && len(l.Covers) > 1 && coveredRun(pub.Layers, l.Covers) >= 0
	})
}

// unpublished lists the layers the node has not pushed, oldest first. A
// local squash of published layers (Covers) is in the registry as the
// layers it merged; a seeded layer's digest (MountFrom) is in its
// fallback's repository, not the cache's.
func unpublished(info layerfs.CacheInfo) []layerfs.LayerInfo {
	var out []layerfs.LayerInfo
	for _, l := range slices.Backward(info.Layers) {
		if (l.Digest == "" || l.MountFrom != "") && len(l.Covers) == 0 {
			out = append(out, l)
		}
	}
	return out
}

// Status is this node's sync state of a cache, as its CacheReplica
// reports it.
func (s *Syncer) Status(ref layerfs.CacheRef, info layerfs.CacheInfo) kit.SyncStatus {
	return kit.SyncStatus{PublishError: s.PublishError(ref), Unpublished: len(unpublished(info))}
}

// Owes tells whether the node has layers or a squash to publish, or an
// announcement to resolve, in a cache that syncs through pub's registry.
func (s *Syncer) Owes(info layerfs.CacheInfo, pub *v1alpha1.PublishedChain) bool {
	return needsPublish(info, pub) || len(announcedBy(pub, s.node)) > 0
}
