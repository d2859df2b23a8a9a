package erofs

import (
	"fmt"
	"testing"

	"github.com/layercache/layercache/layerfs/erofs/erofstest"
)

// TestRandomTrees writes random overlay-format trees (seeded, so a failure
// names its seed) and compares each mounted image with its source.
func TestRandomTrees(t *testing.T) {
	requireTools(t)
	for seed := range 20 {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			if seed >= 15 { // the path kernels before 6.13 take
				noListxattrat.Store(true)
				defer noListxattrat.Store(false)
			}
			src := t.TempDir()
			erofstest.RandomTree(t, src, uint64(seed))
			img, st := writeImage(t, src)
			t.Logf("%+v", st)
			erofstest.CompareTrees(t, src, mountImage(t, img))
		})
	}
}
