package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	seekable "github.com/SaveTheRbtz/zstd-seekable-format-go/pkg"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/klauspost/compress/zstd"

	"github.com/layercache/layercache/remote/registrytest"
)

// imageBytes is a stand-in image of 5.5 frames: runs of random bytes
// between runs that repeat, so frames compress to different sizes.
func imageBytes(size int) []byte {
	rng := rand.New(rand.NewChaCha8([32]byte{35}))
	out := make([]byte, 0, size)
	for len(out) < size {
		run := min(size-len(out), 1000+rng.IntN(60_000))
		if rng.IntN(2) == 0 {
			for range run {
				out = append(out, byte(rng.Uint32()))
			}
		} else {
			out = append(out, bytes.Repeat([]byte("erofs "), run/6+1)[:run]...)
		}
	}
	return out
}

const testImageSize = 5*FrameBytes + FrameBytes/2

// pushSeekable pushes a stand-in image as a zstd layer and opens its index.
func pushSeekable(t *testing.T, tg *Target) ([]byte, Blob, *Index) {
	t.Helper()
	ctx := context.Background()
	image := imageBytes(testImageSize)
	blob, err := tg.PushLayer(ctx, t.TempDir(), exportOf(image))
	if err != nil {
		t.Fatal(err)
	}
	if blob.IndexSize <= 0 || blob.Index.Hex == "" {
		t.Fatalf("zstd push returned no index: %+v", blob)
	}
	idx, err := tg.OpenIndex(ctx, blob.Index.String(), blob.IndexSize)
	if err != nil {
		t.Fatal(err)
	}
	return image, blob, idx
}

func readRange(ctx context.Context, fetch func(context.Context, int64, int64) (io.ReadCloser, error), off, n int64) ([]byte, error) {
	rc, err := fetch(ctx, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func TestRangeFetchReadsTheImageBytes(t *testing.T) {
	ranges := []struct {
		name    string
		off, n  int64
		ofFrame int // frames the range covers
	}{
		{"start", 0, 100, 1},
		{"one whole frame", FrameBytes, FrameBytes, 1},
		{"middle, spanning frames", FrameBytes - 10, 2*FrameBytes + 20, 4},
		{"end", testImageSize - 100, 100, 1},
		{"last byte", testImageSize - 1, 1, 1},
		{"whole", 0, testImageSize, 6},
		{"nothing", 17, 0, 0},
	}
	for _, registry := range []struct {
		name        string
		ignoreRange bool
		status      string
	}{{"registry serves ranges", false, " 206"}, {"registry ignores ranges", true, " 200"}} {
		t.Run(registry.name, func(t *testing.T) {
			reg := registrytest.New(t)
			reg.SetIgnoreRange(registry.ignoreRange)
			tg := target(t, reg, Zstd)
			image, blob, idx := pushSeekable(t, tg)
			fetch := tg.RangeFetch(blob.Digest.String(), idx)
			gets := 0
			for _, r := range ranges {
				t.Run(r.name, func(t *testing.T) {
					got, err := readRange(context.Background(), fetch, r.off, r.n)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, image[r.off:r.off+r.n]) {
						t.Errorf("read %d bytes at %d: got %d bytes, not the image's", r.n, r.off, len(got))
					}
					if r.n > 0 {
						gets++
					}
					blobGets := blobGets(reg, blob.Digest.String(), gets)
					if len(blobGets) != gets || (r.n > 0 && !strings.HasSuffix(blobGets[gets-1], registry.status)) {
						t.Errorf("blob requests so far: %q, want %d, the last answered%s", blobGets, gets, registry.status)
					}
				})
			}
		})
	}
}

// blobGets lists the GETs of blob digest in the registry's log, once
// there are want of them or a while has passed: a request is logged when
// its handler returns, which for a whole blob cut short by the reader
// may be after the read.
func blobGets(reg *registrytest.Registry, digest string, want int) []string {
	var out []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		out = out[:0]
		for _, l := range reg.Log() {
			if strings.HasPrefix(l, "GET ") && strings.Contains(l, "/blobs/"+digest) {
				out = append(out, l)
			}
		}
		if len(out) >= want {
			break
		}
	}
	return out
}

func TestRangeFetchRefusesRangesOutsideTheImage(t *testing.T) {
	reg := registrytest.New(t)
	tg := target(t, reg, Zstd)
	_, blob, idx := pushSeekable(t, tg)
	fetch := tg.RangeFetch(blob.Digest.String(), idx)
	for _, r := range [][2]int64{{-1, 10}, {0, -1}, {testImageSize - 10, 11}, {testImageSize + 1, 0}} {
		if _, err := fetch(context.Background(), r[0], r[1]); err == nil || !strings.Contains(err.Error(), "outside its") {
			t.Errorf("range [%d, +%d): %v, want an error that it is outside the image", r[0], r[1], err)
		}
	}
}

// A plain zstd decoder, as nodes pull with today, reads a seekable blob
// whole (the seek table is a skippable frame), and its digest verifies.
func TestSeekableBlobReadsWhole(t *testing.T) {
	reg := registrytest.New(t)
	tg := target(t, reg, Zstd)
	image, blob, idx := pushSeekable(t, tg)
	if got := fetchWhole(t, tg, blob); !bytes.Equal(got, image) {
		t.Errorf("whole fetch: %d bytes, want the %d-byte image", len(got), len(image))
	}
	if idx.ImageBytes != testImageSize || idx.FrameBytes != FrameBytes || len(idx.Frames) != 6 {
		t.Errorf("index %d bytes in %d frames of %d, want %d in 6 of %d", idx.ImageBytes, len(idx.Frames), idx.FrameBytes, testImageSize, FrameBytes)
	}
	checkSeekTable(t, tg, blob, idx)
}

// checkSeekTable reads the blob's seek table with the format's own reader:
// it must agree with the index.
func checkSeekTable(t *testing.T, tg *Target, blob Blob, idx *Index) {
	t.Helper()
	rc, err := tg.FetchCompressed(context.Background(), blob.Digest.String())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	sr, err := seekable.NewReader(bytes.NewReader(raw), dec)
	if err != nil {
		t.Fatalf("the blob's seek table: %v", err)
	}
	defer sr.Close()
	table, err := sr.SeekTable()
	if err != nil {
		t.Fatal(err)
	}
	if n := table.NumFrames(); n != int64(len(idx.Frames)) {
		t.Fatalf("seek table has %d frames, index %d", n, len(idx.Frames))
	}
	for i, f := range idx.Frames {
		e, ok := table.EntryByID(int64(i))
		if !ok || int64(e.CompressedOffset) != f.Offset || int64(e.CompressedSize) != f.Size {
			t.Errorf("frame %d: seek table %+v, index %+v", i, e, f)
		}
	}
}

func TestRangeFetchRefusesATamperedFrame(t *testing.T) {
	reg := registrytest.New(t)
	tg := target(t, reg, Zstd)
	image, blob, idx := pushSeekable(t, tg)
	fetch := tg.RangeFetch(blob.Digest.String(), idx)
	bad := idx.Frames[2]
	reg.SetFlipByte(blob.Digest.String(), bad.Offset+bad.Size/2)
	for _, ignoreRange := range []bool{false, true} {
		reg.SetIgnoreRange(ignoreRange)
		_, err := readRange(context.Background(), fetch, FrameBytes+5, 2*FrameBytes)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "frame 2 ") || !strings.Contains(err.Error(), blob.Digest.String()) {
			t.Errorf("read over a flipped byte of frame 2 (ignore range %v): %v, want ErrCorrupt naming the layer and frame 2", ignoreRange, err)
		}
		got, err := readRange(context.Background(), fetch, 3*FrameBytes, 100)
		if err != nil || !bytes.Equal(got, image[3*FrameBytes:3*FrameBytes+100]) {
			t.Errorf("read of frame 3 beside a tampered frame 2 (ignore range %v): %v", ignoreRange, err)
		}
	}
}

func TestOpenIndexRefusesATamperedIndex(t *testing.T) {
	reg := registrytest.New(t)
	tg := target(t, reg, Zstd)
	_, blob, _ := pushSeekable(t, tg)
	reg.SetFlipByte(blob.Index.String(), 20)
	_, err := tg.OpenIndex(context.Background(), blob.Index.String(), blob.IndexSize)
	if err == nil || !strings.Contains(err.Error(), "error verifying sha256") {
		t.Errorf("open an index with a flipped byte: %v, want a digest mismatch", err)
	}
}

func TestOpenIndexRefusesAWrongIndex(t *testing.T) {
	reg := registrytest.New(t)
	tg := target(t, reg, Zstd)
	_, _, good := pushSeekable(t, tg)
	for _, tc := range []struct {
		name   string
		change func(idx *Index) any
		want   string
	}{
		{"frames not contiguous", func(idx *Index) any { idx.Frames[3].Offset++; return idx }, "frame 3: starts at blob byte"},
		{"frames out of order", func(idx *Index) any { idx.Frames[1], idx.Frames[2] = idx.Frames[2], idx.Frames[1]; return idx }, "frame 1: starts at blob byte"},
		{"a frame missing", func(idx *Index) any { idx.Frames = idx.Frames[:5]; return idx }, "5 frames for a"},
		{"more image than frames", func(idx *Index) any { idx.ImageBytes += FrameBytes; return idx }, "want 7"},
		{"empty frame", func(idx *Index) any { idx.Frames[5].Size = 0; return idx }, "frame 5: compressed size 0"},
		{"huge frame", func(idx *Index) any { idx.Frames[5].Size = 1 << 30; return idx }, "frame 5: compressed size 1073741824"},
		{"bad digest", func(idx *Index) any { idx.Frames[0].Digest = "sha256:ABC"; return idx }, `frame 0: digest "sha256:ABC"`},
		{"md5 digest", func(idx *Index) any { idx.Frames[0].Digest = "md5:" + strings.Repeat("0", 32); return idx }, "frame 0: digest"},
		{"frame size out of bounds", func(idx *Index) any { idx.FrameBytes = 1 << 30; return idx }, "frame size 1073741824"},
		{"unknown field", func(idx *Index) any { return map[string]any{"frameBytes": FrameBytes, "chunks": 1} }, `unknown field "chunks"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := *good
			idx.Frames = append([]Frame(nil), good.Frames...)
			digest, size := pushRawIndex(t, tg, tc.change(&idx))
			_, err := tg.OpenIndex(context.Background(), digest, size)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("OpenIndex: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("larger than its stated size", func(t *testing.T) {
		digest, size := pushRawIndex(t, tg, good)
		_, err := tg.OpenIndex(context.Background(), digest, size-1)
		if err == nil || !strings.Contains(err.Error(), "longer than") {
			t.Errorf("OpenIndex bounded below the index's size: %v, want an error that it is longer", err)
		}
	})
}

func pushRawIndex(t *testing.T, tg *Target, v any) (string, int64) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	layer := static.NewLayer(data, MediaTypeIndex)
	if err := ggcr.WriteLayer(tg.Repository, layer, tg.options(ggcr.WithContext(context.Background()))...); err != nil {
		t.Fatal(err)
	}
	digest, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest.String(), int64(len(data))
}

func TestGzipPushHasNoIndex(t *testing.T) {
	reg := registrytest.New(t)
	tg := target(t, reg, Gzip)
	blob, err := tg.PushLayer(context.Background(), t.TempDir(), exportOf(imageBytes(FrameBytes+1)))
	if err != nil {
		t.Fatal(err)
	}
	if blob.IndexSize != 0 || blob.Index.Hex != "" {
		t.Errorf("gzip push returned index %s (%d bytes), want none: gzip layers are read whole", blob.Index, blob.IndexSize)
	}
	for _, l := range reg.Log() {
		if strings.Contains(l, "PUT") && strings.Count(l, "digest=") > 0 && !strings.Contains(l, blob.Digest.Hex) {
			t.Errorf("gzip push uploaded a blob besides the layer: %s", l)
		}
	}
}

// An image whose size is a multiple of the frame size has no short frame.
func TestSeekableBlobOfWholeFrames(t *testing.T) {
	for _, size := range []int{0, 1, FrameBytes, 2 * FrameBytes} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			reg := registrytest.New(t)
			tg := target(t, reg, Zstd)
			image := imageBytes(size)
			blob, err := tg.PushLayer(context.Background(), t.TempDir(), exportOf(image))
			if err != nil {
				t.Fatal(err)
			}
			idx, err := tg.OpenIndex(context.Background(), blob.Index.String(), blob.IndexSize)
			if err != nil {
				t.Fatal(err)
			}
			if want := (size + FrameBytes - 1) / FrameBytes; len(idx.Frames) != want {
				t.Errorf("%d frames for %d bytes, want %d", len(idx.Frames), size, want)
			}
			got, err := readRange(context.Background(), tg.RangeFetch(blob.Digest.String(), idx), 0, int64(size))
			if err != nil || !bytes.Equal(got, image) {
				t.Errorf("whole range: %d bytes, %v", len(got), err)
			}
		})
	}
}

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after -= len(p); w.after < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

// A push whose blob cannot be written fails, and does not hang with
// frames still to hand out.
func TestSeekableWriterFailsWithItsSink(t *testing.T) {
	sw, err := newSeekableWriter(&failingWriter{after: 100})
	if err != nil {
		t.Fatal(err)
	}
	image := imageBytes(20 * FrameBytes)
	_, err = sw.Write(image)
	err = errors.Join(err, sw.Close())
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("write through a failing sink: %v, want its error", err)
	}
}
