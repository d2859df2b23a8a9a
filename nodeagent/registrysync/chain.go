package registrysync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
)

// sameChain checks a chain re-read for an update: it must still be the
// one this node checked and pushes to, and keep the chain's shape, or the
// node writes nothing to it.
func sameChain(ref layerfs.CacheRef, reg *kit.RegistryRef, pub *v1alpha1.PublishedChain) error {
	switch {
	case pub.Repository != reg.Repository:
		return &untrustedError{Cache: ref, Field: "repository", Value: fmt.Sprintf("%q", pub.Repository),
			Expected: fmt.Sprintf("%q, where this node checked the chain and pushed the layer (the chain changed under the push)", reg.Repository)}
	case pub.Secret != reg.Secret:
		return &untrustedError{Cache: ref, Field: "secret", Value: fmt.Sprintf("%q", pub.Secret),
			Expected: fmt.Sprintf("%q, which this node checked and pushed with (the chain changed under the push)", reg.Secret)}
	}
	return checkShape(ref, pub)
}

// pushed is a layer whose blob is in the cache's repository and not
// yet in its chain.
type pushed struct {
	layer layerfs.LayerInfo
	blob  remote.Blob
	// direction is how the blob got there, for the registry metrics:
	// push (exported), mount or copy (a seeded layer's fallback blob).
	direction string
	start     time.Time
}

// putBlob puts layer's blob into the cache's repository: a seeded
// layer's by mounting the fallback blob it keeps (or copying it, if the
// registry will not mount), when sources has that blob from the
// repository the layer names; any other layer, or one whose mount and
// copy both fail, by export and push. Exports are deterministic, so a
// retry pushes the same blob. nil if the layer was squashed away
// meanwhile (the squash is published instead).
func (s *Syncer) putBlob(ctx context.Context, ref layerfs.CacheRef, target *remote.Target, layer layerfs.LayerInfo, sources map[string]seedSource) (*pushed, error) {
	start := time.Now()
	if src, ok := sources[layer.Digest]; ok && layer.MountFrom != "" && src.repository == layer.MountFrom {
		how, err := target.MountBlob(ctx, src.from, src.blob)
		if err == nil {
			return &pushed{layer: layer, blob: src.blob, direction: how, start: start}, nil
		}
		log.FromContext(ctx).Info("Could not mount or copy a seeded layer's blob; exporting the layer", "cache", ref.String(),
			"layer", layer.ID, "digest", layer.Digest, "from", layer.MountFrom, "err", err.Error())
	}
	blob, err := target.PushLayer(ctx, s.tmpDir, func(w io.Writer) error {
		return s.store.ExportLayer(ctx, ref, layer.ID, w)
	})
	if errors.Is(err, layerfs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &pushed{layer: layer, blob: blob, direction: "push", start: start}, nil
}

// appendPushed appends the pushed layers (oldest first) to the chain in
// one update, then records their digests on the node. In that order: a
// layer whose digest the node records is always in the chain, so a
// crash in between only makes the next publish put the same blobs again
// and find them already appended.
//
// The append also settles announcements in the same update (see
// landed): the commit's own goes, and those of gone nodes.
func (s *Syncer) appendPushed(ctx context.Context, ref layerfs.CacheRef, reg *kit.RegistryRef, ps []pushed, gone []string) (*v1alpha1.PublishedChain, error) {
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var refused error
	cache, err := s.caches.UpdatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if pub == nil {
			return pub, false
		}
		var added []pushed
		for _, p := range ps {
			if !slices.ContainsFunc(pub.Layers, func(l v1alpha1.PublishedLayer) bool { return l.Digest == p.blob.Digest.String() }) {
				added = append(added, p)
			}
		}
		if len(added) == 0 {
			return pub, false // appended before a crash, with its announcement
		}
		if refused = sameChain(ref, reg, pub); refused != nil {
			return pub, false
		}
		pub.Announced = s.landed(ctx, pub.Announced, gone)
		for _, p := range added {
			pub.Generation++
			l := publishedLayer(p.blob)
			l.Generation, l.Node = pub.Generation, s.node
			pub.Layers = slices.Insert(pub.Layers, 0, l)
		}
		return pub, true
	})
	if err == nil {
		err = refused
	}
	if err != nil || cache == nil || cache.Status.Published == nil {
		return nil, err
	}
	for _, p := range ps {
		if err := s.store.SetLayerDigest(ctx, ref, p.layer.ID, p.blob.Digest.String()); err != nil && !errors.Is(err, layerfs.ErrNotFound) {
			return nil, fmt.Errorf("record digest %s of layer %s: %w", p.blob.Digest, p.layer.ID, err)
		}
		s.published(ctx, ref, p, cache.Status.Published.Generation)
	}
	return cache.Status.Published, nil
}

// published counts and logs a layer that is in the chain now.
func (s *Syncer) published(ctx context.Context, ref layerfs.CacheRef, p pushed, generation int64) {
	s.metrics.RegistryLayers.WithLabelValues(p.direction).Inc()
	if p.direction != remote.Mounted {
		s.metrics.RegistryBytes.WithLabelValues(p.direction).Add(float64(p.blob.Size))
	}
	s.metrics.RegistrySeconds.WithLabelValues(p.direction).Observe(time.Since(p.start).Seconds())
	s.metrics.PublishLag.Observe(time.Since(p.layer.Created).Seconds())
	log.FromContext(ctx).Info("Published", "cache", ref.String(), "layer", p.layer.ID, "digest", p.blob.Digest.String(), "how", p.direction,
		"generation", generation, "bytes", p.blob.Size, "imageBytes", p.blob.ImageBytes, "seconds", time.Since(p.start).Seconds())
}

// publishSquashes publishes the node's squashes of published layers, so
// that the chain stays as short as the node's: a squash's blob replaces
// the run of layers it covers, if the chain still has that run (another
// node may have squashed it first, and its squash wins). Nodes that hold
// the covered layers keep them (Sync matches a squash by what it
// covers); new nodes fetch one blob instead of many. It returns the
// chain as written, or nil if nothing was published.
func (s *Syncer) publishSquashes(ctx context.Context, ref layerfs.CacheRef, reg *kit.RegistryRef, target *remote.Target, info layerfs.CacheInfo, pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, error) {
	var out *v1alpha1.PublishedChain
	for _, layer := range info.Layers {
		if layer.Digest != "" || len(layer.Covers) < 2 || coveredRun(pub.Layers, layer.Covers) < 0 {
			continue
		}
		blob, err := target.PushLayer(ctx, s.tmpDir, func(w io.Writer) error {
			return s.store.ExportLayer(ctx, ref, layer.ID, w)
		})
		if errors.Is(err, layerfs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		next, err := s.replaceRun(ctx, ref, reg, layer, blob)
		if err != nil {
			return nil, err
		}
		if next != nil {
			out, pub = next, next
		}
	}
	return out, nil
}

// replaceRun swaps the run of the chain that layer covers for blob, and
// records blob's digest on the node.
func (s *Syncer) replaceRun(ctx context.Context, ref layerfs.CacheRef, reg *kit.RegistryRef, layer layerfs.LayerInfo, blob remote.Blob) (*v1alpha1.PublishedChain, error) {
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	replaced := false
	var refused error
	cache, err := s.caches.UpdatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		i := -1
		if pub != nil {
			if refused = sameChain(ref, reg, pub); refused != nil {
				return pub, false
			}
			i = coveredRun(pub.Layers, layer.Covers)
		}
		if replaced = i >= 0; !replaced {
			return pub, false
		}
		squash := publishedLayer(blob)
		squash.Generation, squash.Node, squash.Covers = pub.Layers[i].Generation, s.node, layer.Covers
		pub.Layers = slices.Replace(pub.Layers, i, i+len(layer.Covers), squash)
		return pub, true
	})
	if err == nil {
		err = refused
	}
	if err != nil || cache == nil || !replaced {
		return nil, err
	}
	if err := s.store.SetLayerDigest(ctx, ref, layer.ID, blob.Digest.String()); err != nil && !errors.Is(err, layerfs.ErrNotFound) {
		return nil, fmt.Errorf("record digest %s of squashed layer %s: %w", blob.Digest, layer.ID, err)
	}
	log.FromContext(ctx).Info("Published squash", "cache", ref.String(), "layer", layer.ID, "digest", blob.Digest.String(), "replaced", len(layer.Covers))
	return cache.Status.Published, nil
}

// coveredRun returns where the digests covers (newest first) run in
// layers, or -1.
func coveredRun(layers []v1alpha1.PublishedLayer, covers []string) int {
	for i := 0; i+len(covers) <= len(layers); i++ {
		match := true
		for j, d := range covers {
			if layers[i+j].Digest != d {
				match = false
				break
			}
		}
		if match {
			return i
		}
	}
	return -1
}

// BlobsBaseFirst are the chain's blobs, base first, as PushManifest
// lists them.
func BlobsBaseFirst(pub *v1alpha1.PublishedChain) []remote.Blob {
	var out []remote.Blob
	for _, l := range slices.Backward(pub.Layers) {
		out = append(out, blobOf(l))
	}
	return out
}

// blobOf is the blob a chain layer names, with its index blob.
func blobOf(l v1alpha1.PublishedLayer) remote.Blob {
	return remote.BlobOf(l.Digest, l.DiffID, l.MediaType, l.Size, l.Index, l.IndexSize)
}

// publishedLayer is the chain entry of a pushed blob, without its place
// in the chain (generation, node, covers). It names the blob's index, if
// it has one, so that nodes can mount the layer before its bytes arrive.
func publishedLayer(b remote.Blob) v1alpha1.PublishedLayer {
	l := v1alpha1.PublishedLayer{Digest: b.Digest.String(), DiffID: b.DiffID.String(), MediaType: string(b.MediaType), Size: b.Size}
	if b.Index != (v1.Hash{}) {
		l.Index, l.IndexSize = b.Index.String(), b.IndexSize
	}
	return l
}
