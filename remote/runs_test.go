package remote

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
)

// The runs framing is plain zstd: the decoder every node has reads it back
// exactly, and runs of one byte value take a few bytes.
func TestRunsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for _, tc := range []struct {
		name    string
		data    []byte
		maxBlob int // 0: no bound
	}{
		{"empty", nil, 16},
		{"one byte", []byte{7}, 16},
		{"random, not block-aligned", random(300_001), 0},
		{"8 MiB of zeros", make([]byte, 8<<20), 1 << 10},
		{"a 0xff map", bytes.Repeat([]byte{0xff}, 512<<10), 64},
		{"data among zeros", append(append(make([]byte, 1<<20), random(4097)...), make([]byte, 3<<20)...), 12 << 10},
		{"runs of two values", append(bytes.Repeat([]byte{1}, 6000), bytes.Repeat([]byte{2}, 9000)...), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var blob bytes.Buffer
			w := newRunsWriter(&blob)
			// Odd write sizes cross the block boundaries.
			for rest := tc.data; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(200_000))
				if _, err := w.Write(rest[:n]); err != nil {
					t.Fatal(err)
				}
				rest = rest[n:]
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			size := blob.Len()
			rc, err := decompress(io.NopCloser(&blob))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !bytes.Equal(got, tc.data) {
				t.Fatalf("round trip of %d bytes gave %d different bytes", len(tc.data), len(got))
			}
			if tc.maxBlob > 0 && size > tc.maxBlob {
				t.Errorf("%d bytes framed as %d, want at most %d", len(tc.data), size, tc.maxBlob)
			}
		})
	}
}
