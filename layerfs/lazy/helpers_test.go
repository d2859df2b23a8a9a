package lazy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// testImage is an image of size bytes: random data, but zeros over its
// second quarter (a sparse file's hole inside a layer image).
func testImage(size int64, seed byte) []byte {
	img := make([]byte, size)
	rand.NewChaCha8([32]byte{seed}).Read(img)
	clear(img[size/4 : size/2])
	return img
}

// registry serves an image over HTTP on loopback, with Range (as a
// registry serves a blob), through an optional fault.
type registry struct {
	*httptest.Server
	img      []byte
	requests atomic.Int64
	mu       sync.Mutex
	offsets  []int64 // each request's first byte, in order
	// fault, if set, may answer request n (from 1) itself and return true.
	fault func(n int64, w http.ResponseWriter, r *http.Request) bool
}

func newRegistry(t testing.TB, img []byte, fault func(int64, http.ResponseWriter, *http.Request) bool) *registry {
	reg := startRegistry(img, fault)
	t.Cleanup(reg.Close)
	return reg
}

// startRegistry is newRegistry outside a test (the crash tests' child).
func startRegistry(img []byte, fault func(int64, http.ResponseWriter, *http.Request) bool) *registry {
	reg := &registry{img: img, fault: fault}
	reg.Server = httptest.NewServer(http.HandlerFunc(reg.serve))
	return reg
}

func (reg *registry) serve(w http.ResponseWriter, r *http.Request) {
	n := reg.requests.Add(1)
	var off int64
	fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-", &off)
	reg.mu.Lock()
	reg.offsets = append(reg.offsets, off)
	reg.mu.Unlock()
	if reg.fault != nil && reg.fault(n, w, r) {
		return
	}
	http.ServeContent(w, r, "blob", time.Time{}, bytes.NewReader(reg.img))
}

// fetch is the registry's blob as a Fetch: one range request.
func (reg *registry) fetch(ctx context.Context, off, n int64) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, reg.URL+"/blob", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		resp.Body.Close()
		return nil, fmt.Errorf("GET bytes %d-%d: %s", off, off+n-1, resp.Status)
	}
	return resp.Body, nil
}

func (reg *registry) chunksAsked(chunkSize int64) []int {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	var cs []int
	for _, off := range reg.offsets {
		cs = append(cs, int(off/chunkSize))
	}
	return cs
}

// Faults.

func failFirst(k int64) func(int64, http.ResponseWriter, *http.Request) bool {
	return func(n int64, w http.ResponseWriter, _ *http.Request) bool {
		if n > k {
			return false
		}
		http.Error(w, "registry restarting", http.StatusServiceUnavailable)
		return true
	}
}

func failAlways(n int64, w http.ResponseWriter, r *http.Request) bool {
	return failFirst(1<<62)(n, w, r)
}

// stall answers nothing until the client gives up.
func stall(_ int64, _ http.ResponseWriter, r *http.Request) bool {
	<-r.Context().Done()
	return true
}

// shortFirst answers the first k requests with half the range, as a
// complete (chunked) body.
func shortFirst(k int64, img []byte) func(int64, http.ResponseWriter, *http.Request) bool {
	return func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if n > k {
			return false
		}
		var from, to int64
		fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &from, &to)
		w.WriteHeader(http.StatusPartialContent)
		w.Write(img[from : from+(to+1-from)/2])
		return true
	}
}

// corrupt serves other bytes than the image's.
func corrupt(img []byte) func(int64, http.ResponseWriter, *http.Request) bool {
	bad := slices.Clone(img)
	for i := 0; i < len(bad); i += 1000 {
		bad[i] ^= 0xff
	}
	return func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		http.ServeContent(w, r, "blob", time.Time{}, bytes.NewReader(bad))
		return true
	}
}

// ignoreRange serves the whole blob whatever the range.
func ignoreRange(img []byte) func(int64, http.ResponseWriter, *http.Request) bool {
	return func(_ int64, w http.ResponseWriter, _ *http.Request) bool {
		w.Write(img)
		return true
	}
}

// slow delays every answer, so that fetches overlap.
func slow(d time.Duration) func(int64, http.ResponseWriter, *http.Request) bool {
	return func(int64, http.ResponseWriter, *http.Request) bool {
		time.Sleep(d)
		return false
	}
}

func chunkDigests(img []byte, chunkSize int64) []digest.Digest {
	var ds []digest.Digest
	for off := int64(0); off < int64(len(img)); off += chunkSize {
		ds = append(ds, digest.FromBytes(img[off:min(off+chunkSize, int64(len(img)))]))
	}
	return ds
}

// options are a File's of img at a fresh path in dir, over reg.
func options(t testing.TB, reg *registry, chunkSize int64) Options {
	return Options{Path: filepath.Join(t.TempDir(), "image"), Size: int64(len(reg.img)), ChunkSize: chunkSize, Fetch: reg.fetch}
}

func open(t testing.TB, o Options) *File {
	t.Helper()
	f, err := Open(o)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

func readAt(t testing.TB, f *File, off, n int64) []byte {
	t.Helper()
	p := make([]byte, n)
	got, err := f.ReadAt(context.Background(), p, off)
	if err != nil && err != io.EOF {
		t.Fatalf("read [%d, %d): %v", off, off+n, err)
	}
	return p[:got]
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
