package remote_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/layercache/layercache/internal/benchtime"
	"github.com/layercache/layercache/remote"
	"github.com/layercache/layercache/remote/registrytest"
)

// exportImage writes the layer's EROFS image to a file once, so that the
// compressions compared read the same bytes from the page cache and pay
// nothing for the export.
func (n *benchNode) exportImage(layer string) remote.Export {
	n.b.Helper()
	path := filepath.Join(n.b.TempDir(), "image.erofs")
	f, err := os.Create(path)
	if err != nil {
		n.b.Fatal(err)
	}
	defer f.Close()
	if err := n.store.ExportLayer(context.Background(), benchCache, layer, f); err != nil {
		n.b.Fatal(err)
	}
	return func(w io.Writer) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(w, f)
		return err
	}
}

// BenchmarkSeekableBlob compares a zstd layer as a seekable blob (1 MiB
// frames and a seek table, what PushLayer pushes) with one zstd stream of
// the same image (what it pushed before), same encoder settings:
// compressed size (seekable/stream-size, goal <= 1.1), compression
// throughput (seekable/stream-push, goal >= 0.9) and a whole blob's fetch
// and decompression (seekable/stream-pull, goal >= 0.9). Medians of three
// runs in turns.
func BenchmarkSeekableBlob(b *testing.B) {
	files, bytes := benchSize(b)
	src := newBenchNode(b)
	export := src.exportImage(src.fill(files, bytes))
	reg := registrytest.New(b)
	target := benchTarget(b, reg, remote.Zstd)
	kinds := map[string]bool{"seekable": true, "stream": false}
	var compressed, pulled = map[string][]time.Duration{}, map[string][]time.Duration{}
	blobs := map[string]remote.Blob{}
	for round := range 3 {
		for _, kind := range turns(round, "seekable", "stream") {
			compressed[kind] = append(compressed[kind], timed(func() {
				if _, err := target.CompressLayer(b.TempDir(), export, kinds[kind]); err != nil {
					b.Fatal(err)
				}
			}))
		}
	}
	blobs["seekable"] = pushWith(b, target.PushLayer, export)
	blobs["stream"] = pushWith(b, target.PushStream, export)
	for round := range 3 {
		for _, kind := range turns(round, "seekable", "stream") {
			pulled[kind] = append(pulled[kind], timed(func() { fetchWhole(b, target, blobs[kind]) }))
		}
	}
	image := float64(blobs["stream"].ImageBytes)
	b.Logf("image %d bytes: seekable %d, stream %d; compress %v / %v, pull %v / %v", blobs["stream"].ImageBytes,
		blobs["seekable"].Size, blobs["stream"].Size, compressed["seekable"], compressed["stream"], pulled["seekable"], pulled["stream"])
	b.ReportMetric(image/1e6/benchtime.Median(compressed["seekable"]).Seconds(), "seekable-push-MB/s")
	b.ReportMetric(image/1e6/benchtime.Median(pulled["seekable"]).Seconds(), "seekable-pull-MB/s")
	b.ReportMetric(float64(blobs["seekable"].Size)/float64(blobs["stream"].Size), "seekable/stream-size")
	b.ReportMetric(benchtime.Median(compressed["stream"]).Seconds()/benchtime.Median(compressed["seekable"]).Seconds(), "seekable/stream-push")
	b.ReportMetric(benchtime.Median(pulled["stream"]).Seconds()/benchtime.Median(pulled["seekable"]).Seconds(), "seekable/stream-pull")
}

// turns orders kinds differently each round, so that neither always
// runs on a cache the other warmed.
func turns(round int, kinds ...string) []string {
	out := make([]string, len(kinds))
	for i := range kinds {
		out[i] = kinds[(i+round)%len(kinds)]
	}
	return out
}

func pushWith(b *testing.B, push func(context.Context, string, remote.Export) (remote.Blob, error), export remote.Export) remote.Blob {
	b.Helper()
	blob, err := push(context.Background(), b.TempDir(), export)
	if err != nil {
		b.Fatal(err)
	}
	return blob
}

// fetchWhole fetches and decompresses a whole blob, as a pull does, to
// nowhere: the disk is not what the formats differ in.
func fetchWhole(b *testing.B, t *remote.Target, blob remote.Blob) {
	b.Helper()
	rc, err := t.Fetch(context.Background(), blob.Digest.String(), blob.Size)
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	if n, err := io.Copy(io.Discard, rc); err != nil || n != blob.ImageBytes {
		b.Fatalf("fetched %d of %d image bytes: %v", n, blob.ImageBytes, err)
	}
}

// BenchmarkRangeFetch reads a seekable layer by range, as a lazily
// mounted layer does, against a whole blob's fetch and decompression:
//   - 10% of the image in 1 MiB reads spread over it, one after another,
//     as a build's first reads (spread10/whole-time: the reads' time over
//     the whole fetch's);
//   - the whole image in 8 MiB ranges, four at a time, as the background
//     fill (fill/whole-fetch: its throughput over the whole fetch's, goal
//     >= 0.8).
func BenchmarkRangeFetch(b *testing.B) {
	files, bytes := benchSize(b)
	src := newBenchNode(b)
	export := src.exportImage(src.fill(files, bytes))
	reg := registrytest.New(b)
	target := benchTarget(b, reg, remote.Zstd)
	blob := pushWith(b, target.PushLayer, export)
	idx, err := target.OpenIndex(context.Background(), blob.Index.String(), blob.IndexSize)
	if err != nil {
		b.Fatal(err)
	}
	fetch := target.RangeFetch(blob.Digest.String(), idx)
	var whole, spread, fill []time.Duration
	for range 3 {
		whole = append(whole, timed(func() { fetchWhole(b, target, blob) }))
		spread = append(spread, timed(func() { readSpread(b, fetch, idx, 10) }))
		fill = append(fill, timed(func() { readParallel(b, fetch, idx.ImageBytes, 8<<20, 4) }))
	}
	b.Logf("image %d bytes in %d frames: whole %v, 10%% spread %v, parallel fill %v", idx.ImageBytes, len(idx.Frames), whole, spread, fill)
	b.ReportMetric(float64(idx.ImageBytes)/1e6/benchtime.Median(fill).Seconds(), "fill-MB/s")
	b.ReportMetric(benchtime.Median(spread).Seconds()/benchtime.Median(whole).Seconds(), "spread10/whole-time")
	b.ReportMetric(benchtime.Median(whole).Seconds()/benchtime.Median(fill).Seconds(), "fill/whole-fetch")
}

type rangeFetch = func(ctx context.Context, off, n int64) (io.ReadCloser, error)

// readSpread reads one frame in every `every`, one read at a time.
func readSpread(b *testing.B, fetch rangeFetch, idx *remote.Index, every int) {
	b.Helper()
	for i := 0; i < len(idx.Frames); i += every {
		off := int64(i) * idx.FrameBytes
		readTo(b, fetch, off, min(idx.FrameBytes, idx.ImageBytes-off))
	}
}

// readParallel reads the whole image in ranges of size, workers at a time.
func readParallel(b *testing.B, fetch rangeFetch, image, size int64, workers int) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for off := next.Add(size) - size; off < image; off = next.Add(size) - size {
				readTo(b, fetch, off, min(size, image-off))
			}
		})
	}
	wg.Wait()
}

func readTo(b *testing.B, fetch rangeFetch, off, n int64) {
	rc, err := fetch(context.Background(), off, n)
	if err != nil {
		b.Error(err)
		return
	}
	defer rc.Close()
	if got, err := io.Copy(io.Discard, rc); err != nil || got != n {
		b.Errorf("range [%d, +%d): read %d bytes: %v", off, n, got, err)
	}
}
