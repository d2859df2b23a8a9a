package layerfs

import (
	"fmt"
	"testing"
	"time"

	"github.com/layercache/layercache/layerfs/erofs/erofstest"
)

// TestRandomTreesCrossStores builds a random layer on one store (node A),
// publishes it as an EROFS image, pulls it onto another (node B), and
// compares what a volume of the cache shows on each node. Both views are
// overlay mounts, so whiteouts and opaque directories take effect alike on
// both sides; what is compared is everything a build can see. The seeds
// are TestRandomTrees's (layerfs/erofs), so a failure here on a seed that
// passes there points at the store rather than the image writer.
func TestRandomTreesCrossStores(t *testing.T) {
	for seed := range 8 {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			start := time.Now()
			var opts []erofstest.TreeOption
			if seed == 0 {
				opts = append(opts, erofstest.WithDeepPath(erofstest.DeepDepth))
			}
			a := newTestStore(t, Options{})
			mustMount(t, a, "build", "ns/c")
			// Straight into the upper directory, where a build's writes land,
			// before anything looks up through the overlay and caches what
			// it found.
			erofstest.RandomTree(t, upperOf(t, a, "build"), uint64(seed), opts...)
			mustCommit(t, a, "build")
			reg := registry{}
			chain := publish(t, a, reg, "ns/c")

			b := newTestStore(t, Options{})
			if res := mustSync(t, b, "ns/c", chain, reg.fetch); res.Fetched != 1 {
				t.Fatalf("Sync = %+v, want the one layer fetched", res)
			}
			want := mustMount(t, a, "view", "ns/c")
			got := mustMount(t, b, "view", "ns/c")
			// Each view's root is its own volume's new upper directory.
			erofstest.CompareTrees(t, want, got, erofstest.IgnoreRootMtime(), erofstest.IgnoreDanglingWhiteouts())
			t.Logf("seed %d: %v", seed, time.Since(start))
		})
	}
}
