package registrysync

import (
	"strings"
	"testing"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/remote"
)

// A chain entry and the blob it names go both ways without losing the
// index: a manifest or a mount made from the chain must keep the layer
// readable by range.
func TestPublishedLayerKeepsTheIndex(t *testing.T) {
	d := func(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }
	for _, tc := range []struct {
		name string
		blob remote.Blob
		want v1alpha1.PublishedLayer
	}{
		{"seekable", remote.BlobOf(d('a'), d('b'), string(remote.MediaTypeImageZstd), 100, d('c'), 140),
			v1alpha1.PublishedLayer{Digest: d('a'), DiffID: d('b'), MediaType: string(remote.MediaTypeImageZstd), Size: 100, Index: d('c'), IndexSize: 140}},
		{"read whole only", remote.BlobOf(d('a'), d('b'), string(remote.MediaTypeImageGzip), 100, "", 0),
			v1alpha1.PublishedLayer{Digest: d('a'), DiffID: d('b'), MediaType: string(remote.MediaTypeImageGzip), Size: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := publishedLayer(tc.blob)
			if got.Digest != tc.want.Digest || got.DiffID != tc.want.DiffID || got.MediaType != tc.want.MediaType ||
				got.Size != tc.want.Size || got.Index != tc.want.Index || got.IndexSize != tc.want.IndexSize {
				t.Errorf("publishedLayer = %+v, want %+v", got, tc.want)
			}
			if back := blobOf(got); back != tc.blob {
				t.Errorf("blobOf(publishedLayer(b)) = %+v, want %+v", back, tc.blob)
			}
		})
	}
}

// chainOf hands layerfs what a lazy mount needs: the diff ID that checks
// the finished copy, and the index that maps the blob.
func TestChainOfCarriesTheIndex(t *testing.T) {
	d := func(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }
	pub := &v1alpha1.PublishedChain{Generation: 2, Layers: []v1alpha1.PublishedLayer{
		{Digest: d('b'), DiffID: d('c'), MediaType: string(remote.MediaTypeImageZstd), Size: 10, Generation: 2, Index: d('d'), IndexSize: 140},
		{Digest: d('a'), DiffID: d('e'), MediaType: string(remote.MediaTypeImageGzip), Size: 10, Generation: 1},
	}}
	c := chainOf(pub)
	if len(c.Layers) != 2 {
		t.Fatalf("chainOf: %d layers, want 2", len(c.Layers))
	}
	for i, want := range []struct {
		diffID, index string
		indexSize     int64
		lazy          bool
	}{{d('c'), d('d'), 140, true}, {d('e'), "", 0, false}} {
		l := c.Layers[i]
		if l.DiffID != want.diffID || l.Index != want.index || l.IndexSize != want.indexSize || l.Lazy() != want.lazy {
			t.Errorf("layer %d: %+v (Lazy %v), want diff ID %s, index %q of %d bytes (Lazy %v)", i, l, l.Lazy(), want.diffID, want.index, want.indexSize, want.lazy)
		}
	}
}
