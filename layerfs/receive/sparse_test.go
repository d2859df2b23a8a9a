package receive

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/erofs"
)

// The image is written with holes only where zeros run for holeMin or
// more; shorter runs are written, as they cost less than the extents
// they would split.
func TestSparseWriterHoles(t *testing.T) {
	const block = erofs.BlockSize
	type run struct {
		zero bool
		n    int
	}
	tests := []struct {
		name      string
		runs      []run
		wantHoles int64 // bytes
	}{
		{"data only", []run{{false, 3 * block}}, 0},
		{"short zeros are written", []run{{false, block}, {true, holeMin - block}, {false, block}}, 0},
		{"long zeros are a hole", []run{{false, block}, {true, holeMin}, {false, block}}, holeMin},
		{"leading and trailing holes", []run{{true, 4 * holeMin}, {false, 100}, {true, 8 * holeMin}}, 4*holeMin + 8*holeMin - block},
		{"a hole across writes", []run{{false, 10}, {true, 3 << 20}, {false, block}}, 3<<20 - block},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want []byte
			for i, r := range tt.runs {
				chunk := make([]byte, r.n)
				if !r.zero {
					for j := range chunk {
						chunk[j] = byte(i + 1)
					}
				}
				want = append(want, chunk...)
			}
			f, err := os.Create(filepath.Join(t.TempDir(), "image"))
			must(t, err)
			defer f.Close()
			w := NewSparseWriter(f, 0)
			writes := 0
			for rest := want; len(rest) > 0; writes++ { // writes of odd sizes, as a stream gives them
				n := min(len(rest), 1<<20+7)
				_, err := w.Write(rest[:n])
				must(t, err)
				rest = rest[n:]
			}
			must(t, w.Finish())
			got, err := os.ReadFile(f.Name())
			must(t, err)
			if !bytes.Equal(got, want) {
				t.Fatalf("the file differs from what was written (%d bytes, want %d)", len(got), len(want))
			}
			// The block a write's tail completes is written whole.
			slack := int64(max(writes-1, 0)) * block
			if holes := holeBytes(t, f); holes > tt.wantHoles || holes < tt.wantHoles-slack {
				t.Errorf("%d bytes of holes, want %d (less at most %d)", holes, tt.wantHoles, slack)
			}
		})
	}
}

// holeBytes counts f's bytes that are holes (SEEK_HOLE to SEEK_DATA).
func holeBytes(t *testing.T, f *os.File) int64 {
	t.Helper()
	st, err := f.Stat()
	must(t, err)
	var holes int64
	for off := int64(0); off < st.Size(); {
		hole, err := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
		must(t, err)
		if hole >= st.Size() {
			break
		}
		data, err := unix.Seek(int(f.Fd()), hole, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = st.Size()
		} else {
			must(t, err)
		}
		holes += data - hole
		off = data
	}
	return holes
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
