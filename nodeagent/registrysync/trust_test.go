package registrysync

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/remote"
)

// maven is the cache the chains below belong to.
var maven = layerfs.CacheRef{Namespace: "ci", Name: "maven"}

func TestCheckShape(t *testing.T) {
	d := func(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }
	layer := func(gen int64, digest string, covers ...string) v1alpha1.PublishedLayer {
		return v1alpha1.PublishedLayer{Digest: digest, Size: 10, Generation: gen, Covers: covers, MediaType: string(remote.MediaTypeImageZstd)}
	}
	for _, tc := range []struct {
		name string
		pub  v1alpha1.PublishedChain
		want string // "" for a chain the agents could have written
	}{
		{"empty", v1alpha1.PublishedChain{}, ""},
		{"empty with a generation", v1alpha1.PublishedChain{Generation: 3}, "a chain without layers has generation 0"},
		{"appends", v1alpha1.PublishedChain{Generation: 3, Layers: []v1alpha1.PublishedLayer{layer(3, d('c')), layer(2, d('b')), layer(1, d('a'))}}, ""},
		{"squash below an append", v1alpha1.PublishedChain{Generation: 6, Layers: []v1alpha1.PublishedLayer{layer(6, d('c')), layer(5, d('b'), d('e'), d('f'))}}, ""},
		{"squash of squashes", v1alpha1.PublishedChain{Generation: 40, Layers: []v1alpha1.PublishedLayer{layer(40, d('b'), d('e'), d('f'))}}, ""},
		{"squash of fewer commits than layers", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{layer(1, d('b'), d('e'), d('f'))}}, "at least 2"},
		{"generations rise", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{layer(1, d('b')), layer(2, d('a'))}}, "strictly decrease"},
		{"a gap", v1alpha1.PublishedChain{Generation: 5, Layers: []v1alpha1.PublishedLayer{layer(5, d('b')), layer(1, d('a'))}}, "is one commit"},
		{"bad digest", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{layer(1, "sha256:../../x")}}, "layers[0].digest"},
		{"bad covered digest", v1alpha1.PublishedChain{Generation: 2, Layers: []v1alpha1.PublishedLayer{layer(2, d('a'), "md5:x", d('f'))}}, "layers[0].covers[0]"},
		{"no size", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{{Digest: d('a'), Generation: 1}}}, "layers[0].size"},
		// Issue 33, finding 7: a tenant-written mediaType sent a blob down
		// the tar import path, where a sparse tar unpacked past its bound.
		{"an OCI tar layer", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{{Digest: d('a'), Size: 10, Generation: 1, MediaType: "application/vnd.oci.image.layer.v1.tar"}}}, "layers[0].mediaType"},
		{"announced", v1alpha1.PublishedChain{Announced: []v1alpha1.AnnouncedLayer{{Node: "node-a", Volume: "pvc-1", Generation: 1}}}, ""},
		{"announced by no node", v1alpha1.PublishedChain{Announced: []v1alpha1.AnnouncedLayer{{Node: "../x", Volume: "pvc-1"}}}, "announced[0].node"},
		{"announced without a volume", v1alpha1.PublishedChain{Announced: []v1alpha1.AnnouncedLayer{{Node: "node-a", Volume: "../x"}}}, "announced[0].volume"},
		{"too many announced", v1alpha1.PublishedChain{Announced: make([]v1alpha1.AnnouncedLayer, maxAnnounced+1)}, "at most 64"},
		// Issue 33, finding 2: one blob listed many times passed, and a
		// node fetched and stored it as many times.
		{"a digest listed twice", v1alpha1.PublishedChain{Generation: 2, Layers: []v1alpha1.PublishedLayer{layer(2, d('a')), layer(1, d('a'))}}, "layers[0].digest names it"},
		{"a squash covering a layer of the chain", v1alpha1.PublishedChain{Generation: 3, Layers: []v1alpha1.PublishedLayer{layer(3, d('b'), d('a'), d('c')), layer(1, d('a'))}}, "layers[0].covers[0] names it"},
		{"a squash of one layer naming it", v1alpha1.PublishedChain{Generation: 2, Layers: []v1alpha1.PublishedLayer{layer(2, d('a'), d('a'))}}, ""},
		{"an index", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{indexed(layer(1, d('a')), d('9'), 140)}}, ""},
		{"an index of another algorithm", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{indexed(layer(1, d('a')), "sha512:"+strings.Repeat("i", 128), 140)}}, "layers[0].index"},
		{"an index that is no digest", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{indexed(layer(1, d('a')), "sha256:../../x", 140)}}, "layers[0].index"},
		{"an index without a size", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{indexed(layer(1, d('a')), d('9'), 0)}}, "layers[0].indexSize is 0"},
		{"an index of negative size", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{indexed(layer(1, d('a')), d('9'), -1)}}, "a positive size"},
		{"an index size without an index", v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{indexed(layer(1, d('a')), "", 140)}}, "layers[0].indexSize is 140"},
		{"too long", chainOfLength(maxChainLayers + 1), "at most 500"},
		{"as long as a node can mount", chainOfLength(maxChainLayers), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkShape(maven, &tc.pub)
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("checkShape: %v, want error containing %q", err, tc.want)
			}
		})
	}
}

// indexed is l with an index blob.
func indexed(l v1alpha1.PublishedLayer, index string, size int64) v1alpha1.PublishedLayer {
	l.Index, l.IndexSize = index, size
	return l
}

// An index is read whole into memory before its layer mounts: one larger
// than a layer within the bound has is refused as a layer over the bound
// is (ErrTooLarge), before anything is fetched.
func TestCheckIndexBounds(t *testing.T) {
	d := func(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }
	chain := func(indexSize int64) *v1alpha1.PublishedChain {
		return &v1alpha1.PublishedChain{Generation: 2, Layers: []v1alpha1.PublishedLayer{
			indexed(v1alpha1.PublishedLayer{Digest: d('b'), Size: 10, Generation: 2}, d('8'), indexSize),
			{Digest: d('a'), Size: 10, Generation: 1},
		}}
	}
	for _, tc := range []struct {
		name      string
		indexSize int64
		bound     int64
		tooLarge  bool
	}{
		{"one frame's index", 140, 1 << 20, false},
		{"at the bound of one frame", 64 + 256, 1 << 20, false},
		{"past the bound of one frame", 64 + 256 + 1, 1 << 20, true},
		{"a part frame counts whole", 64 + 2*256, 1<<20 + 1, false},
		{"at the bound of 20 GiB", 64 + 256*20*1024, 20 << 30, false},
		{"past the bound of 20 GiB", 64 + 256*20*1024 + 1, 20 << 30, true},
		{"no bound: 256 GiB's index", 64 + 256*256*1024, 0, false},
		{"no bound: past 256 GiB's index", 64 + 256*256*1024 + 1, 0, true},
		{"a bound near 2^63", 1 << 40, 1<<63 - 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkIndexBounds(maven, chain(tc.indexSize), tc.bound)
			if errors.Is(err, layerfs.ErrTooLarge) != tc.tooLarge || (err != nil && !tc.tooLarge) {
				t.Errorf("checkIndexBounds(index of %d bytes, bound %d) = %v, want ErrTooLarge %v", tc.indexSize, tc.bound, err, tc.tooLarge)
			}
			if err != nil && !strings.Contains(err.Error(), d('8')) {
				t.Errorf("error %q does not name the index", err)
			}
		})
	}
}

// chainOfLength is a well-formed chain of n appends.
func chainOfLength(n int) v1alpha1.PublishedChain {
	pub := v1alpha1.PublishedChain{Generation: int64(n)}
	for g := n; g > 0; g-- {
		pub.Layers = append(pub.Layers, v1alpha1.PublishedLayer{Digest: digest.FromString(fmt.Sprint(g)).String(), Size: 10, Generation: int64(g), MediaType: string(remote.MediaTypeImageZstd)})
	}
	return pub
}

func TestCheckJump(t *testing.T) {
	d := "sha256:" + strings.Repeat("a", 64)
	squash := func(gen int64) v1alpha1.PublishedLayer {
		return v1alpha1.PublishedLayer{Digest: d, Size: 1, Generation: gen, Covers: []string{d, d}}
	}
	plain := func(gen int64) v1alpha1.PublishedLayer {
		return v1alpha1.PublishedLayer{Digest: d, Size: 1, Generation: gen}
	}
	chain := func(layers ...v1alpha1.PublishedLayer) *v1alpha1.PublishedChain {
		return &v1alpha1.PublishedChain{Generation: layers[0].Generation, Layers: layers}
	}
	day := 24 * time.Hour
	for _, tc := range []struct {
		name    string
		pub     *v1alpha1.PublishedChain
		check   chainCheck
		refused bool
	}{
		{"appends since the node's generation", chain(plain(7), plain(6), plain(5)), chainCheck{applied: 5, age: time.Minute}, false},
		{"a stale chain", chain(plain(3)), chainCheck{applied: 9}, false},
		{"a month of commits squashed while the node slept", chain(plain(20001), squash(20000)), chainCheck{applied: 5, age: 30 * day}, false},
		{"a fresh node, an old squashed cache", chain(squash(100000)), chainCheck{age: 365 * day}, false},
		{"more commits than a young Cache could have", chain(squash(100000)), chainCheck{age: time.Hour}, true},
		{"toward overflow", chain(squash(1 << 62)), chainCheck{applied: 5, age: 365 * day}, true},
		{"a jump without a squash", chain(plain(1000), plain(999)), chainCheck{applied: 5, age: 365 * day}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkJump(maven, tc.pub, tc.check)
			if (err != nil) != tc.refused {
				t.Errorf("checkJump: %v, want refused %v", err, tc.refused)
			}
		})
	}
}
