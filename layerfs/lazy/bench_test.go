package lazy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/internal/benchsize"
	"github.com/layercache/layercache/internal/benchtime"
	"github.com/layercache/layercache/layerfs/receive"
)

// BenchmarkFill measures Fill of a whole image, 1 MiB chunks 4 at a time,
// against its baseline in the same run: the pull of today, one GET of the
// whole blob from the same server written to a file as a pull writes it
// (receive's pipelined copy into its sparse writer, then an fsync). The
// ratio fill/get-throughput is the background completion (>= 0.8).
// Full size: 512 MiB (LAZY_BENCH_MIB sets it); smoke: 64 MiB.
func BenchmarkFill(b *testing.B) { benchFill(b, false) }

// BenchmarkFillVerified is BenchmarkFill with the digests checked on both
// sides: the pull hashes its stream (as the registry client does), Fill
// checks each chunk's digest and the whole image's. Fill hashes every
// byte twice, the pull once; on a 2-core node that also serves the blob
// it is CPU-bound, so this ratio says what the chunk digests cost.
func BenchmarkFillVerified(b *testing.B) { benchFill(b, true) }

func benchFill(b *testing.B, verified bool) {
	size := int64(benchsize.Env(b, "LAZY_BENCH_MIB", benchsize.Pick(b, 512, 64), "the image's size in MiB")) << 20
	img := testImage(size, 12)
	reg := newRegistry(b, img, nil)
	o := Options{Size: size, ChunkSize: 1 << 20}
	if verified {
		o.ChunkDigests, o.Digest = chunkDigests(img, o.ChunkSize), digest.FromBytes(img)
	}
	// A registry client pools a connection per concurrent fetch; the
	// default client keeps only 2 idle per host.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
	dir := b.TempDir()
	get := func() {
		path := filepath.Join(dir, "pulled")
		defer os.Remove(path)
		must(b, pull(client, reg.URL+"/blob", path, size, verified))
	}
	fill := func() {
		path := filepath.Join(dir, "lazy")
		defer os.Remove(path)
		defer os.Remove(statePath(path))
		o.Path, o.Fetch = path, clientFetch(client, reg.URL+"/blob")
		f, err := Open(o)
		must(b, err)
		must(b, f.Fill(context.Background()))
		must(b, f.Close())
	}
	get() // warm the server's and the client's connections alike
	untimed := func() { b.StopTimer(); get(); b.StartTimer() }
	reps := benchsize.Pick(b, 5, 3)
	var gets, fills []time.Duration
	for b.Loop() { // the timer counts the fills only: b.SetBytes gives their MB/s
		g, f := benchtime.Compare(reps, untimed, fill)
		gets, fills = append(gets, g), append(fills, f)
	}
	b.SetBytes(size * int64(reps))
	g, f := benchtime.Median(gets), benchtime.Median(fills)
	b.ReportMetric(float64(size)/g.Seconds()/(1<<20), "get-MiB/s")
	b.ReportMetric(float64(size)/f.Seconds()/(1<<20), "fill-MiB/s")
	b.ReportMetric(float64(g)/float64(f), "fill/get-throughput")
}

// pull GETs the whole blob into path as a pull does, hashing it if
// verified.
func pull(client *http.Client, url, path string, size int64, verified bool) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	w := receive.NewSparseWriter(out, 0)
	var body io.Reader = resp.Body
	if verified {
		body = io.TeeReader(body, sha256.New())
	}
	n, err := receive.CopyPipelined(w, body, 1<<20, 4)
	if err != nil || n != size {
		return fmt.Errorf("pulled %d of %d bytes: %v", n, size, err)
	}
	if err := w.Finish(); err != nil {
		return err
	}
	return unix.Fdatasync(int(out.Fd()))
}

func clientFetch(client *http.Client, url string) Fetch {
	return func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusPartialContent {
			resp.Body.Close()
			return nil, fmt.Errorf("GET bytes %d-%d: %s", off, off+n-1, resp.Status)
		}
		return resp.Body, nil
	}
}
