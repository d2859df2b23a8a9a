package registrysync

import (
	"context"
	"fmt"
	"math/bits"

	"github.com/go-logr/logr"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
)

// Mount first (issue 35): a node mounts a published layer before its bytes
// are here, and reads the blob by range through the layer's index blob.
// layerfs does the mounting; what it needs from the registry is here.

// openLazyFrom opens chain layers of target for reads by range, within
// bounds. The index is read whole (at most the size the chain states, which
// the trust rules bound) and checked before a byte of the layer is read.
func openLazyFrom(target *remote.Target, bounds *kit.RegistryRef) layerfs.OpenLazy {
	return func(ctx context.Context, cache layerfs.CacheRef, layer layerfs.ChainLayer) (layerfs.LazySource, error) {
		if !layer.Lazy() {
			return layerfs.LazySource{}, fmt.Errorf("layer %s of cache %s has no index or diff ID in its chain, so it cannot be read by range; fetch it whole", layer.Digest, cache)
		}
		idx, err := target.OpenIndex(ctx, layer.Index, layer.IndexSize)
		if err != nil {
			return layerfs.LazySource{}, fmt.Errorf("open layer %s of cache %s for reads by range: %w", layer.Digest, cache, err)
		}
		if bounds.MaxLayerBytes > 0 && idx.ImageBytes > bounds.MaxLayerBytes {
			return layerfs.LazySource{}, fmt.Errorf("layer %s of cache %s: its image is %d bytes as its index %s states, over the bound of %d (%s): %w",
				layer.Digest, cache, idx.ImageBytes, layer.Index, bounds.MaxLayerBytes, bounds.BoundFrom, layerfs.ErrTooLarge)
		}
		// The local copy fetches in chunks of a power of two; a frame of
		// another size would split frames across chunks and fetch each twice.
		if bits.OnesCount64(uint64(idx.FrameBytes)) != 1 {
			return layerfs.LazySource{}, fmt.Errorf("layer %s of cache %s: its index %s has frames of %d bytes, want a power of two such as %d; fetch it whole",
				layer.Digest, cache, layer.Index, idx.FrameBytes, remote.FrameBytes)
		}
		src := layerfs.LazySource{ImageBytes: idx.ImageBytes, ChunkBytes: idx.FrameBytes, Fetch: target.RangeFetch(layer.Digest, idx)}
		src.Prefetch, src.RecordReads = prefetchOf(ctx, target, cache, layer, idx)
		return src, nil
	}
}

// prefetchOf reads layer's prefetch list: the frames the first build on a
// fresh node read, which this node fetches first. Without one, the
// layer's reads here, once its copy is complete, become that list. A
// list that cannot be read or fails its checks only changes the fetch
// order: it is logged and ignored.
func prefetchOf(ctx context.Context, target *remote.Target, cache layerfs.CacheRef, layer layerfs.ChainLayer, idx *remote.Index) ([]int, func(context.Context, []int) error) {
	p, err := target.FetchPrefetch(ctx, layer.Digest, idx)
	if err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "Ignore the prefetch list of a layer; it is fetched in order", "cache", cache.String(), "digest", layer.Digest)
	}
	if len(p.Frames) > 0 {
		return p.Frames, nil
	}
	record := func(ctx context.Context, chunks []int) error {
		return target.PushPrefetch(ctx, layer.Digest, idx, chunks)
	}
	return nil, record
}

// syncOptions are the options of a Sync to a chain within bounds: with
// the class's mountFirst, layers with an index mount at once, and a read
// of bytes the registry cannot give waits up to the class's syncTimeout,
// as a claim waits for the layers it lacks.
func syncOptions(target *remote.Target, bounds *kit.RegistryRef) layerfs.SyncOptions {
	opts := layerfs.SyncOptions{MaxLayerBytes: bounds.MaxLayerBytes}
	if bounds.MountFirst {
		opts.OpenLazy, opts.LazyWait = openLazyFrom(target, bounds), bounds.SyncTimeout
	}
	return opts
}

// ReopenLazy opens a layer that the node mounted before its bytes were
// here, after an agent restart, to serve its reads and finish its copy
// (a layerfs.OpenLazy). The chain is read and checked again, as a Sync's
// is: the layer is read by range only while the trusted chain still
// lists it with the index it was mounted with.
func (s *Syncer) ReopenLazy(ctx context.Context, ref layerfs.CacheRef, layer layerfs.ChainLayer) (layerfs.LazySource, error) {
	cache, err := s.caches.Live(ctx, ref)
	if err != nil {
		return layerfs.LazySource{}, fmt.Errorf("read cache %s to reopen layer %s: %w", ref, layer.Digest, err)
	}
	if cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil {
		return layerfs.LazySource{}, fmt.Errorf("cache %s has no published chain now, so layer %s cannot be read from its registry: %w", ref, layer.Digest, layerfs.ErrNotFound)
	}
	bounds, err := s.checkChain(ctx, cache)
	if err != nil {
		return layerfs.LazySource{}, err
	}
	if err := stillListed(ref, cache.Status.Published, layer); err != nil {
		return layerfs.LazySource{}, err
	}
	if err := checkIndexBounds(ref, cache.Status.Published, bounds.MaxLayerBytes); err != nil {
		return layerfs.LazySource{}, err
	}
	target, err := s.target(ctx, bounds)
	if err != nil {
		return layerfs.LazySource{}, err
	}
	return openLazyFrom(target, bounds)(ctx, ref, layer)
}

// stillListed checks that the chain lists layer with the index it was
// mounted with; ErrNotFound if it does not.
func stillListed(ref layerfs.CacheRef, pub *v1alpha1.PublishedChain, layer layerfs.ChainLayer) error {
	for _, l := range pub.Layers {
		if l.Digest != layer.Digest {
			continue
		}
		if l.Index != layer.Index || l.IndexSize != layer.IndexSize {
			return fmt.Errorf("the chain of cache %s lists layer %s with index %q (%d bytes), not the %q (%d bytes) it was mounted with: %w",
				ref, layer.Digest, l.Index, l.IndexSize, layer.Index, layer.IndexSize, layerfs.ErrNotFound)
		}
		return nil
	}
	return fmt.Errorf("the chain of cache %s no longer lists layer %s: %w", ref, layer.Digest, layerfs.ErrNotFound)
}

// ReopenLazy is a layerfs.OpenLazy.
var _ layerfs.OpenLazy = (*Syncer)(nil).ReopenLazy
