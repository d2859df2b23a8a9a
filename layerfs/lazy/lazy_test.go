package lazy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

const testChunk = 64 << 10

func TestOpenValidates(t *testing.T) {
	fetch := func(context.Context, int64, int64) (io.ReadCloser, error) { return nil, nil }
	good := Options{Path: "/nonexistent/image", Size: 10 * testChunk, ChunkSize: testChunk, Fetch: fetch}
	tests := []struct {
		name   string
		change func(*Options)
		want   string
	}{
		{"no path", func(o *Options) { o.Path = "" }, "Options.Path"},
		{"no size", func(o *Options) { o.Size = 0 }, "Options.Size 0"},
		{"chunk not a power of two", func(o *Options) { o.ChunkSize = 5000 }, "Options.ChunkSize 5000"},
		{"chunk too small", func(o *Options) { o.ChunkSize = 2048 }, "Options.ChunkSize 2048"},
		{"no fetch", func(o *Options) { o.Fetch = nil }, "Options.Fetch"},
		{"chunk digests of another count", func(o *Options) { o.ChunkDigests = make([]digest.Digest, 3) }, "has 3 digests: want one per chunk, 10"},
		{"chunk digest not sha256", func(o *Options) {
			o.ChunkDigests = chunkDigests(make([]byte, 10*testChunk), testChunk)
			o.ChunkDigests[4] = digest.SHA512.FromString("x")
		}, "Options.ChunkDigests[4]"},
		{"digest malformed", func(o *Options) { o.Digest = "sha256:abc" }, "Options.Digest"},
		{"negative wait", func(o *Options) { o.Wait = -time.Second }, "Options.Wait"},
		{"too parallel", func(o *Options) { o.Parallel = 1000 }, "Options.Parallel 1000"},
		{"prefetch past the end", func(o *Options) { o.Prefetch = []int{1, 10} }, "Options.Prefetch[1] = 10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good
			tt.change(&o)
			_, err := Open(o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open: %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// A small read of a large image fetches only the chunks it touches.
func TestReadFetchesOnlyItsChunks(t *testing.T) {
	img := testImage(256*testChunk+123, 1)
	reg := newRegistry(t, img, nil)
	f := open(t, options(t, reg, testChunk))
	reads := []struct {
		off, n   int64
		requests int64 // in all, so far
	}{
		{37*testChunk + 100, 200, 1},
		{37*testChunk + 5000, 10, 1},             // the same chunk: local now
		{41*testChunk - 10, 20, 3},               // across two chunks
		{int64(len(img)) - 50, 50, 4},            // the last, partial chunk
		{int64(len(img)/4) + 1000, testChunk, 6}, // zeros
	}
	for _, r := range reads {
		if got := readAt(t, f, r.off, r.n); !bytes.Equal(got, img[r.off:r.off+r.n]) {
			t.Fatalf("read [%d, %d) differs from the image", r.off, r.off+r.n)
		}
		if n := reg.requests.Load(); n != r.requests {
			t.Fatalf("after the read [%d, %d): %d requests, want %d", r.off, r.off+r.n, n, r.requests)
		}
	}
	st := f.Stats()
	if want := int64(5*testChunk + 123); st.OnDemandBytes != want || st.BackgroundBytes != 0 {
		t.Errorf("stats %+v, want %d bytes on demand, none in the background", st, want)
	}
	if st.Stalls != 4 || st.LocalChunks != 6 || f.Complete() {
		t.Errorf("stats %+v: want 4 stalls, 6 local chunks, not complete", st)
	}
}

// Reads at and past the end behave as os.File.ReadAt's.
func TestReadAtEnd(t *testing.T) {
	img := testImage(3*testChunk+10, 2)
	f := open(t, options(t, newRegistry(t, img, nil), testChunk))
	p := make([]byte, 100)
	n, err := f.ReadAt(context.Background(), p, int64(len(img))-40)
	if n != 40 || err != io.EOF || !bytes.Equal(p[:n], img[len(img)-40:]) {
		t.Errorf("read across the end: %d, %v; want 40, EOF and the image's last bytes", n, err)
	}
	if n, err := f.ReadAt(context.Background(), p, int64(len(img))); n != 0 || err != io.EOF {
		t.Errorf("read at the end: %d, %v; want 0, EOF", n, err)
	}
	if _, err := f.ReadAt(context.Background(), p, -1); err == nil {
		t.Error("read at offset -1 succeeded")
	}
}

// Concurrent readers of a chunk wait for one fetch.
func TestConcurrentReadersShareAFetch(t *testing.T) {
	img := testImage(8*testChunk, 3)
	reg := newRegistry(t, img, slow(50*time.Millisecond))
	f := open(t, options(t, reg, testChunk))
	const readers = 16
	var wg sync.WaitGroup
	for i := range readers {
		wg.Go(func() {
			off := 5*testChunk + int64(i)*100
			if got := readAt(t, f, off, 100); !bytes.Equal(got, img[off:off+100]) {
				t.Errorf("reader %d read other bytes", i)
			}
		})
	}
	wg.Wait()
	if n := reg.requests.Load(); n != 1 {
		t.Errorf("%d concurrent readers of a chunk made %d requests, want 1", readers, n)
	}
	// Readers that came after the fetch read the copy without a stall.
	if st := f.Stats(); st.OnDemandBytes != testChunk || st.Stalls < 1 || st.Stalls > readers {
		t.Errorf("stats %+v: want one chunk on demand, 1 to %d stalls", st, readers)
	}
}

// Fill makes the copy equal to the image, with holes where the image has
// long runs of zeros, and records it complete.
func TestFillCompletesSparse(t *testing.T) {
	img := testImage(128*testChunk+4096+17, 4)
	reg := newRegistry(t, img, nil)
	o := options(t, reg, testChunk)
	o.Digest = digest.FromBytes(img)
	o.ChunkDigests = chunkDigests(img, testChunk)
	f := open(t, o)
	must(t, f.Fill(context.Background()))
	if !f.Complete() {
		t.Fatal("Fill returned nil but the copy is not complete")
	}
	assertCopy(t, o.Path, img)
	var st unix.Stat_t
	must(t, unix.Stat(o.Path, &st))
	zeros := int64(len(img) / 4) // the image's second quarter
	if allocated, most := st.Blocks*512, int64(len(img))-zeros+2*testChunk; allocated > most {
		t.Errorf("the copy takes %d bytes on disk; the image has %d of zeros in %d, so want at most %d", allocated, zeros, len(img), most)
	}
	if s := f.Stats(); s.BackgroundBytes != int64(len(img)) || s.OnDemandBytes != 0 {
		t.Errorf("stats %+v: want every byte fetched in the background", s)
	}
	if n := reg.requests.Load(); n != 129 {
		t.Errorf("Fill made %d requests, want one per chunk, 129", n)
	}
	must(t, f.Close())
	f = open(t, o) // reopened complete: nothing to fetch or check
	if !f.Complete() {
		t.Error("the reopened copy is not complete")
	}
}

func assertCopy(t *testing.T, path string, img []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	must(t, err)
	if !bytes.Equal(got, img) {
		t.Fatalf("the copy (%d bytes) differs from the image (%d bytes)", len(got), len(img))
	}
}

// A read during Fill gets its bytes, and no chunk is fetched twice, even
// the ones Fill was fetching when the read came.
func TestReadDuringFill(t *testing.T) {
	img := testImage(64*testChunk, 5)
	reg := newRegistry(t, img, slow(20*time.Millisecond))
	o := options(t, reg, testChunk)
	o.Parallel = 2
	f := open(t, o)
	filled := make(chan error)
	go func() { filled <- f.Fill(context.Background()) }()
	for _, c := range []int64{58, 2, 3, 33, 60} {
		off := c*testChunk + 7
		if got := readAt(t, f, off, 3*testChunk); !bytes.Equal(got, img[off:off+3*testChunk]) {
			t.Fatalf("read at chunk %d during Fill differs from the image", c)
		}
	}
	must(t, <-filled)
	assertCopy(t, o.Path, img)
	asked := reg.chunksAsked(testChunk)
	slices.Sort(asked)
	if len(slices.Compact(asked)) != len(reg.chunksAsked(testChunk)) {
		t.Errorf("chunks fetched more than once: %v", reg.chunksAsked(testChunk))
	}
	if s := f.Stats(); s.OnDemandBytes+s.BackgroundBytes != int64(len(img)) || s.OnDemandBytes == 0 {
		t.Errorf("stats %+v: want %d bytes in all, some on demand", s, len(img))
	}
}

// A read of a chunk that Fill is fetching waits for Fill's fetch.
func TestReadWaitsForFillsFetch(t *testing.T) {
	img := testImage(4*testChunk, 13)
	release := make(chan struct{})
	reg := newRegistry(t, img, func(n int64, _ http.ResponseWriter, _ *http.Request) bool {
		if n == 1 { // Fill's fetch of chunk 0
			<-release
		}
		return false
	})
	o := options(t, reg, testChunk)
	o.Parallel = 1
	f := open(t, o)
	filled := make(chan error)
	go func() { filled <- f.Fill(context.Background()) }()
	for reg.requests.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	read := make(chan []byte)
	go func() { read <- readAt(t, f, 100, 100) }()
	time.Sleep(20 * time.Millisecond) // most likely waiting by now; if not, it finds the chunk local
	close(release)
	if got := <-read; !bytes.Equal(got, img[100:200]) {
		t.Fatal("the read differs from the image")
	}
	must(t, <-filled)
	if asked := reg.chunksAsked(testChunk); !slices.Equal(asked, []int{0, 1, 2, 3}) {
		t.Errorf("fetched chunks %v, want each once", asked)
	}
	if s := f.Stats(); s.OnDemandBytes != 0 {
		t.Errorf("stats %+v: the read fetched what Fill was fetching", s)
	}
}

// Fill starts no chunk while a read waits on a fetch, nor for readQuiet
// after, then completes the copy.
func TestFillYieldsToReads(t *testing.T) {
	img := testImage(8*testChunk, 14)
	release := make(chan struct{})
	reg := newRegistry(t, img, func(n int64, _ http.ResponseWriter, _ *http.Request) bool {
		if n == 1 { // the read's fetch of chunk 5
			<-release
		}
		return false
	})
	f := open(t, options(t, reg, testChunk))
	read := make(chan []byte)
	go func() { read <- readAt(t, f, 5*testChunk, 10) }()
	for reg.requests.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	filled := make(chan error)
	go func() { filled <- f.Fill(context.Background()) }()
	time.Sleep(2 * readQuiet)
	if n := reg.requests.Load(); n != 1 {
		t.Errorf("%d requests while a read waited on its fetch, want the read's alone", n)
	}
	close(release)
	ended := time.Now()
	if got := <-read; !bytes.Equal(got, img[5*testChunk:5*testChunk+10]) {
		t.Fatal("the read differs from the image")
	}
	must(t, <-filled)
	if waited := time.Since(ended); waited < readQuiet {
		t.Errorf("Fill completed %s after the read's wait ended, want it to wait %s first", waited, readQuiet)
	}
	if asked := reg.chunksAsked(testChunk); len(asked) != 8 || asked[0] != 5 {
		t.Errorf("fetched chunks %v, want 5 (the read's), then the 7 others once", asked)
	}
}

// A read that stalls where the reads before it ended fetches the next
// readAheadChunks chunks beside its own, so reads that go on in order
// find them in the copy; a read elsewhere fetches only its own chunks.
func TestSequentialReadsFetchAhead(t *testing.T) {
	img := testImage(16*testChunk, 9)
	reg := newRegistry(t, img, nil)
	f := open(t, options(t, reg, testChunk))
	readAt(t, f, 12*testChunk, 10) // nothing read before it: its chunk alone
	if asked := reg.chunksAsked(testChunk); !slices.Equal(asked, []int{12}) {
		t.Fatalf("a first read fetched chunks %v, want [12]", asked)
	}
	readAt(t, f, 0, 10)
	readAt(t, f, testChunk, 10) // in order after chunk 0: reads ahead
	want := []int{0, 1, 2, 3, 4, 5}
	for deadline := time.Now().Add(10 * time.Second); f.Stats().LocalChunks < 1+len(want); {
		if time.Now().After(deadline) {
			t.Fatalf("chunks fetched %v, want 12 then %v", reg.chunksAsked(testChunk), want)
		}
		time.Sleep(time.Millisecond)
	}
	for c := int64(2); c < 6; c++ {
		if got := readAt(t, f, c*testChunk, 10); !bytes.Equal(got, img[c*testChunk:c*testChunk+10]) {
			t.Fatalf("read of chunk %d differs from the image", c)
		}
	}
	asked := reg.chunksAsked(testChunk)
	slices.Sort(asked)
	if !slices.Equal(asked, append(want, 12)) {
		t.Errorf("fetched chunks %v, want %v and 12, each once", asked, want)
	}
	if st := f.Stats(); st.Stalls != 3 || st.OnDemandBytes != 7*testChunk {
		t.Errorf("stats %+v, want 3 stalls (the reads of chunks 12, 0 and 1) and 7 chunks fetched for reads", st)
	}
}

// Fill fetches Prefetch first, in its order; the reads' order is recorded
// for the next node.
func TestPrefetchAndReadOrder(t *testing.T) {
	img := testImage(16*testChunk, 6)
	reg := newRegistry(t, img, nil)
	o := options(t, reg, testChunk)
	f := open(t, o)
	for _, c := range []int64{5, 2, 5, 9} {
		readAt(t, f, c*testChunk+10, 10)
	}
	readAt(t, f, 11*testChunk-5, 10) // chunks 10 and 11
	order := f.ReadOrder()
	if want := []int{5, 2, 9, 10, 11}; !slices.Equal(order, want) {
		t.Fatalf("ReadOrder %v, want %v", order, want)
	}

	reg2 := newRegistry(t, img, nil)
	o2 := options(t, reg2, testChunk)
	o2.Prefetch, o2.Parallel = order, 1
	must(t, open(t, o2).Fill(context.Background()))
	asked := reg2.chunksAsked(testChunk)
	if want := []int{5, 2, 9, 10, 11, 0, 1, 3}; !slices.Equal(asked[:len(want)], want) {
		t.Errorf("Fill fetched %v, want %v first", asked, want)
	}
	assertCopy(t, o2.Path, img)
}

// Faults of the registry: a read waits out the transient ones, fails with
// ErrUnavailable past Wait, and fails at once on bytes that are not the
// image's.
func TestReadFaults(t *testing.T) {
	img := testImage(8*testChunk, 7)
	tests := []struct {
		name        string
		fault       func(int64, http.ResponseWriter, *http.Request) bool
		wait        time.Duration
		digests     bool
		want        error // nil: the read succeeds
		maxRequests int64 // 0: any
	}{
		{"fails then recovers", failFirst(3), time.Minute, false, nil, 4},
		{"short bodies", shortFirst(2, img), time.Minute, false, nil, 3},
		{"down past Wait", failAlways, 500 * time.Millisecond, false, ErrUnavailable, 0},
		{"stalls past Wait", stall, 500 * time.Millisecond, false, ErrUnavailable, 0},
		{"corrupt chunk", corrupt(img), time.Minute, true, ErrCorrupt, 1},
		{"whole blob for a range", ignoreRange(img), time.Minute, false, ErrCorrupt, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, img, tt.fault)
			o := options(t, reg, testChunk)
			o.Wait = tt.wait
			if tt.digests {
				o.ChunkDigests = chunkDigests(img, testChunk)
			}
			f := open(t, o)
			p := make([]byte, 100)
			start := time.Now()
			_, err := f.ReadAt(context.Background(), p, 3*testChunk+5)
			took := time.Since(start)
			if !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Fatalf("read: %v, want %v", err, tt.want)
			}
			if err == nil && !bytes.Equal(p, img[3*testChunk+5:][:100]) {
				t.Fatal("the read differs from the image")
			}
			// Not a timing test: a bound far past Wait catches a read
			// that retries forever.
			if errors.Is(err, ErrUnavailable) && took > tt.wait+10*time.Second {
				t.Errorf("the read failed after %s, Wait is %s", took, tt.wait)
			}
			if err != nil && !strings.Contains(err.Error(), "[196608, 262144)") {
				t.Errorf("the error does not name the chunk's range: %v", err)
			}
			if n := reg.requests.Load(); tt.maxRequests > 0 && n > tt.maxRequests {
				t.Errorf("%d requests, want at most %d", n, tt.maxRequests)
			}
			if tt.want == nil && f.Stats().Retries == 0 {
				t.Error("no retries counted")
			}
		})
	}
}
