package registrysync

import (
	"context"
	"errors"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// A snapshot cache's layer is a whole generation (layerfs snapshot_sync.go):
// once one is the newest of the chain, every older layer is dead. Left
// in, they would grow the chain past what the trust check takes
// (maxChainLayers) and keep their blobs in the registry for ever. So the
// node that appended the newest folds the chain into it, as a squash that
// covers the whole chain and whose blob is the newest's own: the chain's
// shape (generations, covers) stays what the trust check knows, and the
// manifest pushed next names one blob, which lets the registry collect
// the rest.

// foldSnapshotChain folds pub into its newest layer if that is the
// node's generation of snapshot cache ref (as the node's head, read
// again, names it once its push is recorded); it returns the chain as
// written, or nil if nothing changed.
func (s *Syncer) foldSnapshotChain(ctx context.Context, ref layerfs.CacheRef, reg *kit.RegistryRef, pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, error) {
	info, err := s.store.Inspect(ctx, ref)
	if errors.Is(err, layerfs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(info.Layers) == 0 || !foldable(pub, info.Layers[0].Digest) {
		return nil, nil
	}
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var refused error
	folded := false
	cache, err := s.caches.UpdatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if folded = foldable(pub, info.Layers[0].Digest); !folded {
			return pub, false
		}
		if refused = sameChain(ref, reg, pub); refused != nil {
			folded = false
			return pub, false
		}
		fold := pub.Layers[0]
		fold.Covers = make([]string, len(pub.Layers))
		for i, l := range pub.Layers {
			fold.Covers[i] = l.Digest
		}
		pub.Layers = []v1alpha1.PublishedLayer{fold}
		return pub, true
	})
	if err == nil {
		err = refused
	}
	if err != nil || cache == nil || !folded {
		return nil, err
	}
	log.FromContext(ctx).Info("Folded the snapshot cache's chain into its newest generation", "cache", ref.String(), "digest", info.Layers[0].Digest)
	return cache.Status.Published, nil
}

// foldable tells whether pub has layers below its newest, which is the
// generation digest.
func foldable(pub *v1alpha1.PublishedChain, digest string) bool {
	return pub != nil && len(pub.Layers) > 1 && pub.Layers[0].Digest == digest
}
