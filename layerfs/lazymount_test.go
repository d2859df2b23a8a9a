package layerfs

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/lazyfs"
	"github.com/layercache/layercache/layerfs/ondisk"
)

// rangeRegistry serves the test registry's blobs by range, as a real
// one serves a seekable blob through its index (remote.RangeFetch; the
// HTTP path is tested in remote and layerfs/lazyfs). Each fetch takes
// delay, so that a background completion takes long enough for a test
// to act before it ends; down makes every fetch fail, as a stopped
// registry does.
type rangeRegistry struct {
	reg   registry
	chunk int64 // each fetch's bytes; 0 means 64 KiB
	delay time.Duration
	// hold, if set, keeps every fetch waiting until it is closed.
	hold  chan struct{}
	down  atomic.Bool
	opens atomic.Int32

	// prefetch is the list each open gives; recorded receives what the
	// store records once a copy is complete; fetched are the chunks
	// fetched, in the order the fetches began.
	prefetch []int
	recorded chan []int
	mu       sync.Mutex
	fetched  []int64
}

// lazyChain is chain with each layer readable by range (the test
// registry stores images uncompressed, so the diff ID is the digest).
func lazyChain(chain Chain) Chain {
	for i := range chain.Layers {
		l := &chain.Layers[i]
		l.DiffID, l.Index, l.IndexSize = l.Digest, l.Digest, 1
	}
	return chain
}

func (r *rangeRegistry) open(_ context.Context, _ CacheRef, l ChainLayer) (LazySource, error) {
	data, ok := r.reg[l.Digest]
	if !ok {
		return LazySource{}, fmt.Errorf("blob %s: not found in the registry", l.Digest)
	}
	r.opens.Add(1)
	chunk := r.chunk
	if chunk == 0 {
		chunk = 64 << 10
	}
	fetch := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		r.mu.Lock()
		r.fetched = append(r.fetched, off/chunk)
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(r.delay):
		}
		if r.hold != nil {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-r.hold:
			}
		}
		if r.down.Load() {
			return nil, errors.New("dial tcp 127.0.0.1:5000: connect: connection refused")
		}
		end := min(off+n, int64(len(data)))
		return io.NopCloser(bytes.NewReader(data[off:end])), nil
	}
	src := LazySource{ImageBytes: int64(len(data)), ChunkBytes: chunk, Fetch: fetch, Prefetch: r.prefetch}
	if r.recorded != nil {
		src.RecordReads = func(_ context.Context, chunks []int) error {
			r.recorded <- chunks
			return nil
		}
	}
	return src, nil
}

// lazyFixture publishes a cache of a small file and a large one (4 MiB
// of random bytes) from a store of its own, and returns its chain.
func lazyFixture(t *testing.T, reg registry) (Chain, []byte) {
	t.Helper()
	a := newTestStore(t, Options{})
	big := make([]byte, 4<<20)
	_, _ = rand.Read(big)
	dir := mustMount(t, a, "build-1", "ns/c")
	writeFile(t, filepath.Join(dir, "small.txt"), "hello")
	must(t, os.WriteFile(filepath.Join(dir, "big.bin"), big, 0o644))
	mustCommit(t, a, "build-1")
	return lazyChain(publish(t, a, reg, "ns/c")), big
}

// lazyFailures records the store's reports of failed reads.
type lazyFailures struct {
	mu   sync.Mutex
	got  []string
	done chan CacheRef
}

func (f *lazyFailures) options(t *testing.T) Options {
	f.done = make(chan CacheRef, 8)
	return Options{
		Log: testr.New(t),
		OnLazyReadFailed: func(cache CacheRef, digest string, err error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.got = append(f.got, fmt.Sprintf("%s %s: %v", cache, digest, err))
		},
		OnLazyComplete: func(cache CacheRef) { f.done <- cache },
	}
}

func (f *lazyFailures) reports() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

// lazyEnv is a fresh store b that syncs the cache lazyFixture published,
// from a registry whose fetches take delay each.
type lazyEnv struct {
	rr    *rangeRegistry
	chain Chain
	big   []byte
	f     lazyFailures
	opts  Options
	b     *Store
}

func newLazyEnv(t *testing.T, delay time.Duration) *lazyEnv {
	t.Helper()
	e := &lazyEnv{rr: &rangeRegistry{reg: registry{}, delay: delay}}
	e.chain, e.big = lazyFixture(t, e.rr.reg)
	e.opts = e.f.options(t)
	e.opts.Root = t.TempDir()
	e.b = newTestStore(t, e.opts)
	return e
}

func syncLazy(t *testing.T, s *Store, chain Chain, rr *rangeRegistry, wait time.Duration) SyncResult {
	t.Helper()
	res, err := s.Sync(context.Background(), mustRef(t, "ns/c"), chain, rr.reg.fetch, SyncOptions{OpenLazy: rr.open, LazyWait: wait})
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return res
}

func waitComplete(t *testing.T, f *lazyFailures) {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the lazily mounted layer was not completed within 30s")
	}
}

func mountedTypes(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (bool, bool) { return m.Mountpoint != dir, false })
	must(t, err)
	var types []string
	for _, m := range mounts {
		types = append(types, m.FSType+" "+m.Source)
	}
	return types
}

// TestSyncLazy: a fresh store mounts a published layer before its bytes
// are here; a build reads its small file at once, having fetched a part
// of the image; the copy completes in the background and settles into an
// image like a pulled one, which later volumes read whole.
func TestSyncLazy(t *testing.T) {
	ctx := context.Background()
	e := newLazyEnv(t, 5*time.Millisecond)
	b, big, f := e.b, e.big, &e.f

	res := syncLazy(t, b, e.chain, e.rr, 0)
	if !res.Changed || res.Fetched != 1 {
		t.Fatalf("Sync = %+v, want one layer", res)
	}
	dir := mustMount(t, b, "build-2", "ns/c")
	if got := readFile(t, filepath.Join(dir, "small.txt")); got != "hello" {
		t.Fatalf("small.txt = %q", got)
	}
	info, err := b.Inspect(ctx, mustRef(t, "ns/c"))
	must(t, err)
	st := b.LazyStats()
	if info.Filling != 1 || st.Filling != 1 {
		t.Errorf("while the copy fills: CacheInfo.Filling %d, LazyStats.Filling %d, want 1", info.Filling, st.Filling)
	}
	if st.OnDemandBytes <= 0 || st.OnDemandBytes >= int64(len(big)) {
		t.Errorf("reads fetched %d bytes on demand, want some, and less than the large file's %d", st.OnDemandBytes, len(big))
	}

	waitComplete(t, f)
	id := info.Layers[0].ID
	if !b.images().Has(id) || ondisk.Exists(b.partialRecordPath(id)) {
		t.Errorf("settled layer %s: image kept %v, partial record still there %v", id, b.images().Has(id), ondisk.Exists(b.partialRecordPath(id)))
	}
	served := filepath.Join(b.lazyfsDir(), id)
	if got := mountedTypes(t, b.layerDir(id)); len(got) != 2 || got[0] != "erofs "+served || got[1] != "erofs "+b.images().Path(id) {
		t.Errorf("mounts at the settled layer's directory: %q, want its lazyfs file's, then the image's, both file-backed", got)
	}
	// The volume mounted before settling reads through the lazyfs file,
	// now from the local image; a new one through the image's mount.
	if got, err := os.ReadFile(filepath.Join(dir, "big.bin")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("big.bin through the first volume: %d bytes, %v; want the published bytes", len(got), err)
	}
	dir3 := mustMount(t, b, "build-3", "ns/c")
	if got, err := os.ReadFile(filepath.Join(dir3, "big.bin")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("big.bin through a volume mounted after settling: %d bytes, %v", len(got), err)
	}
	st = b.LazyStats()
	if st.CompletedLayers != 1 || st.Filling != 0 || st.OnDemandBytes+st.BackgroundBytes < int64(len(big)) {
		t.Errorf("LazyStats after settling = %+v, want 1 completed, none filling, the whole image fetched", st)
	}
	if r := f.reports(); len(r) != 0 {
		t.Errorf("failed reads reported: %q", r)
	}
	mustCommit(t, b, "build-2")

	// Once the layer goes, its lazyfs file goes too.
	mustCommit(t, b, "build-3")
	must(t, b.Remove(ctx, mustRef(t, "ns/c")))
	if _, err := b.GC(ctx, GCOptions{}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if ondisk.Exists(served) {
		t.Errorf("the lazyfs still serves %s after its layer was swept", served)
	}
}

// TestLazyReadFailureDiscards: with the registry down, a read of bytes
// not yet here waits for the layer's wait, then fails with EIO; the
// failure is reported once, and the volume that read it is discarded at
// its end whatever its build wrote.
func TestLazyReadFailureDiscards(t *testing.T) {
	ctx := context.Background()
	e := newLazyEnv(t, 50*time.Millisecond)
	b, big, f, rr := e.b, e.big, &e.f, e.rr
	syncLazy(t, b, e.chain, rr, 300*time.Millisecond)
	dir := mustMount(t, b, "build-2", "ns/c")
	rr.down.Store(true)

	for range 2 {
		fh, err := os.Open(filepath.Join(dir, "big.bin"))
		must(t, err)
		buf := make([]byte, 4096)
		start := time.Now()
		_, err = fh.ReadAt(buf, int64(len(big))-4096) // the end: the background has not come that far
		fh.Close()
		if err == nil {
			t.Fatal("a read of bytes the registry cannot give succeeded")
		}
		if waited := time.Since(start); waited < 250*time.Millisecond {
			t.Errorf("the read failed after %s, before the layer's wait of 300ms", waited)
		}
	}
	if r := f.reports(); len(r) != 1 {
		t.Errorf("failed reads reported %d times (%q), want once per layer", len(r), r)
	}
	writeFile(t, filepath.Join(dir, "out.txt"), "built on errors")
	res, err := b.End(ctx, "build-2", EndOptions{})
	must(t, err)
	if res.Kept || res.FailedRead == "" {
		t.Errorf("End = %+v, want a discard that says a read failed", res)
	}
	if st := b.LazyStats(); st.FailedReads < 2 {
		t.Errorf("LazyStats.FailedReads = %d, want 2", st.FailedReads)
	}

	// The registry is back: the copy completes, and a new volume's build
	// is committed.
	rr.down.Store(false)
	waitComplete(t, f)
	dir = mustMount(t, b, "build-3", "ns/c")
	writeFile(t, filepath.Join(dir, "out.txt"), "built")
	if res, err := b.End(ctx, "build-3", EndOptions{}); err != nil || !res.Kept {
		t.Errorf("End of a volume mounted after the registry came back = %+v, %v, want committed", res, err)
	}
}

// TestResumeLazy: the process serving a partial layer ends (its FUSE
// connection aborted, as at a SIGKILL) while a volume is mounted over
// it. A store opened again refuses volumes over the layer until the
// layer is resumed; then it serves it from what the copy holds, new
// volumes read it, the volume mounted before is discarded at its end,
// and the copy completes.
func TestResumeLazy(t *testing.T) {
	ctx := context.Background()
	e := newLazyEnv(t, 20*time.Millisecond)
	b, big, f, rr := e.b, e.big, &e.f, e.rr
	syncLazy(t, b, e.chain, rr, 0)
	dir := mustMount(t, b, "build-2", "ns/c")
	if got := readFile(t, filepath.Join(dir, "small.txt")); got != "hello" {
		t.Fatalf("small.txt = %q", got)
	}
	must(t, b.Close())

	b2 := newTestStore(t, e.opts)
	if _, err := b2.Mount(ctx, "build-3", MountOptions{Cache: mustRef(t, "ns/c")}); !errors.Is(err, ErrLazyNotServed) {
		t.Fatalf("Mount over a partial layer nothing serves: %v, want ErrLazyNotServed", err)
	}
	must(t, b2.ResumeLazy(ctx, rr.open))
	dir3 := mustMount(t, b2, "build-3", "ns/c")
	if got, err := os.ReadFile(filepath.Join(dir3, "big.bin")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("big.bin after the resume: %d bytes, %v", len(got), err)
	}
	res, err := b2.End(ctx, "build-2", EndOptions{})
	must(t, err)
	if res.Kept || res.FailedRead == "" {
		t.Errorf("End of the volume mounted over the ended process's layer = %+v, want a discard", res)
	}
	waitComplete(t, f)
	if res, err := b2.End(ctx, "build-3", EndOptions{}); err != nil || res.FailedRead != "" {
		t.Errorf("End of the volume mounted after the resume = %+v, %v", res, err)
	}
	assertNoOrphans(t, b2)
}

// TestSweepDropsPartialLayer: a partial layer that no head or volume
// names any more (the chain moved on) is unmounted, no longer served,
// and its files go.
func TestSweepDropsPartialLayer(t *testing.T) {
	ctx := context.Background()
	e := newLazyEnv(t, 50*time.Millisecond)
	b := e.b
	syncLazy(t, b, e.chain, e.rr, 0)
	info, err := b.Inspect(ctx, mustRef(t, "ns/c"))
	must(t, err)
	id := info.Layers[0].ID
	must(t, b.Remove(ctx, mustRef(t, "ns/c")))
	if _, err := b.GC(ctx, GCOptions{}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if ondisk.Exists(b.partialRecordPath(id)) || ondisk.Exists(b.partialCopy(id)) || ondisk.Exists(b.layerDir(id)) {
		t.Errorf("partial layer %s left files behind after the sweep", id)
	}
	if st := b.LazyStats(); st.Filling != 0 {
		t.Errorf("LazyStats.Filling = %d after the sweep, want 0", st.Filling)
	}
}

// TestResumeWhileSyncing: the agent resumes partial layers at each
// maintenance pass, while a Sync may be setting one up (its record
// written, its metadata still being fetched). The resume leaves that
// layer alone: it is not a dead process's, and the build over it reads
// and commits. (CI met the resume detaching a Sync's fresh mount.)
func TestResumeWhileSyncing(t *testing.T) {
	ctx := context.Background()
	e := newLazyEnv(t, 0)
	e.rr.hold = make(chan struct{})
	synced := make(chan error, 1)
	go func() {
		_, err := e.b.Sync(ctx, mustRef(t, "ns/c"), e.chain, e.rr.reg.fetch, SyncOptions{OpenLazy: e.rr.open})
		synced <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for ids, _ := e.b.partialIDs(); len(ids) == 0; ids, _ = e.b.partialIDs() {
		if time.Now().After(deadline) {
			t.Fatal("the Sync recorded no partial layer within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resumed := make(chan error, 1)
	go func() { resumed <- e.b.ResumeLazy(ctx, e.rr.open) }()
	select {
	case err := <-resumed:
		must(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("ResumeLazy waited for a layer a Sync was setting up")
	}
	close(e.rr.hold)
	must(t, <-synced)
	dir := mustMount(t, e.b, "build", "ns/c")
	if got := readFile(t, filepath.Join(dir, "small.txt")); got != "hello" {
		t.Fatalf("small.txt = %q", got)
	}
	writeFile(t, filepath.Join(dir, "out.txt"), "built")
	if res, err := e.b.End(ctx, "build", EndOptions{}); err != nil || !res.Kept {
		t.Errorf("End = %+v, %v; want the build committed", res, err)
	}
}

// TestResumeLazyThroughSidecar: with the lazyfs served by a sidecar
// (Options.LazyfsSidecar), the process that fetched a layer's bytes ends
// while a build's volume is mounted over it: the build's reads wait, the
// next process resumes the layer without touching its mount, the reads
// go on; once the layer settled, they need no agent at all; and the
// build's changes are committed. Needs root.
func TestResumeLazyThroughSidecar(t *testing.T) {
	ctx := context.Background()
	e := newLazyEnv(t, 20*time.Millisecond)
	opts := e.opts
	opts.Root, opts.LazyfsSidecar = t.TempDir(), true
	b := newTestStore(t, opts)
	sc, err := lazyfs.ServeSidecar(LazyfsSidecar(opts.Root), testr.New(t).WithName("sidecar"))
	must(t, err)
	t.Cleanup(func() { must(t, sc.Close()) })

	syncLazy(t, b, e.chain, e.rr, 0)
	dir := mustMount(t, b, "build-2", "ns/c")
	if got := readFile(t, filepath.Join(dir, "small.txt")); got != "hello" {
		t.Fatalf("small.txt = %q", got)
	}
	writeFile(t, filepath.Join(dir, "out.txt"), "built")
	must(t, b.Close()) // the agent ends

	readBig := func() <-chan error {
		read := make(chan error, 1)
		go func() {
			got, err := os.ReadFile(filepath.Join(dir, "big.bin"))
			if err == nil && !bytes.Equal(got, e.big) {
				err = fmt.Errorf("big.bin: %d bytes, not the 4 MiB published", len(got))
			}
			read <- err
		}()
		return read
	}
	read := readBig()
	select {
	case err := <-read:
		t.Fatalf("a read with no agent ended at once (%v); want it to wait for the next one", err)
	case <-time.After(time.Second):
	}
	b2 := newTestStore(t, opts)
	must(t, b2.ResumeLazy(ctx, e.rr.open))
	select {
	case err := <-read:
		must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting read did not end within 30s of the resume")
	}
	waitComplete(t, &e.f)

	// Settled, the layer's file reads the local image in the sidecar
	// alone: the volume mounted over it reads on with no agent at all.
	info, err := b2.Inspect(ctx, mustRef(t, "ns/c"))
	must(t, err)
	must(t, b2.Close())
	// The reads must reach the sidecar: big.bin's pages go from the
	// volume's page cache and from the lazyfs file's below it (not the
	// machine's whole page cache: make test runs a cluster beside).
	dropPages(t, filepath.Join(dir, "big.bin"))
	dropPages(t, filepath.Join(LazyfsSidecar(opts.Root).Dir, info.Layers[0].ID))
	select {
	case err := <-readBig():
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("with no agent, a read of the settled layer through the sidecar did not end within 10s")
	}
	b3 := newTestStore(t, opts)
	res, err := b3.End(ctx, "build-2", EndOptions{})
	must(t, err)
	if !res.Kept || res.FailedRead != "" {
		t.Errorf("End of the build that outlived its agent = %+v, want a commit", res)
	}
	assertNoOrphans(t, b3)
}

// TestPrefetchList: once a fresh store's copy is complete, the chunks
// its reads touched are recorded (the layer's prefetch list); a store
// given that list fetches those chunks first, before the rest in order.
// Needs root.
func TestPrefetchList(t *testing.T) {
	e := newLazyEnv(t, 2*time.Millisecond)
	e.rr.recorded = make(chan []int, 2)
	syncLazy(t, e.b, e.chain, e.rr, 0)
	dir := mustMount(t, e.b, "build-2", "ns/c")
	// The large file's last bytes: chunks that an in-order fetch gets last.
	f, err := os.Open(filepath.Join(dir, "big.bin"))
	must(t, err)
	tail := make([]byte, 64<<10)
	_, err = f.ReadAt(tail, int64(len(e.big)-len(tail)))
	f.Close()
	must(t, err)
	waitComplete(t, &e.f)
	var list []int
	select {
	case list = <-e.rr.recorded:
	case <-time.After(30 * time.Second):
		t.Fatal("no prefetch list was recorded within 30s of the settle")
	}
	last := int((int64(len(e.rr.reg[e.chain.Layers[0].Digest])) - 1) / (64 << 10))
	if len(list) == 0 || len(list) > last/2 {
		t.Fatalf("recorded %d chunks of %d: %v; want the few the mount and one read touched", len(list), last+1, list)
	}

	opts := e.opts
	opts.Root = t.TempDir()
	c := newTestStore(t, opts)
	rr := &rangeRegistry{reg: e.rr.reg, delay: 2 * time.Millisecond, prefetch: list, recorded: make(chan []int, 1)}
	syncLazy(t, c, e.chain, rr, 0)
	waitComplete(t, &e.f)
	rr.mu.Lock()
	fetched := append([]int64(nil), rr.fetched...)
	rr.mu.Unlock()
	// Fill fetches Parallel (4) at a time: a fetch may begin a little
	// before the one queued ahead of it.
	for _, chunk := range list {
		i := slices.Index(fetched, int64(chunk))
		if i < 0 || i >= len(list)+4 {
			t.Errorf("chunk %d of the prefetch list was fetch %d of %d; want it among the first %d", chunk, i, len(fetched), len(list)+4)
		}
	}
	select {
	case got := <-rr.recorded:
		t.Errorf("a store given a prefetch list recorded another: %v", got)
	default:
	}
}

// TestSidecarRestartLosesTheLayer: the lazyfs sidecar restarts while a
// build's volume is mounted over a layer it served, which ends that
// mount: the volume is discarded at its end, no volume is mounted over
// the lost layer until the next resume, which serves and mounts it again.
// Needs root.
func TestSidecarRestartLosesTheLayer(t *testing.T) {
	ctx := context.Background()
	e := newLazyEnv(t, 150*time.Millisecond) // the copy completes in seconds
	opts := e.opts
	opts.Root, opts.LazyfsSidecar = t.TempDir(), true
	b := newTestStore(t, opts)
	cfg := LazyfsSidecar(opts.Root)
	sc, err := lazyfs.ServeSidecar(cfg, testr.New(t).WithName("sidecar"))
	must(t, err)
	syncLazy(t, b, e.chain, e.rr, 0)
	mustMount(t, b, "build-2", "ns/c")

	must(t, sc.Close())
	sc, err = lazyfs.ServeSidecar(cfg, testr.New(t).WithName("sidecar-2"))
	must(t, err)
	t.Cleanup(func() { must(t, sc.Close()) })
	if _, err := b.Mount(ctx, "build-3", MountOptions{Cache: mustRef(t, "ns/c")}); !errors.Is(err, ErrLazyNotServed) {
		t.Fatalf("Mount over a layer the sidecar lost: %v, want ErrLazyNotServed", err)
	}
	res, err := b.End(ctx, "build-2", EndOptions{})
	must(t, err)
	if res.Kept || !strings.Contains(res.FailedRead, "lazyfs sidecar") {
		t.Errorf("End of a volume over a layer the sidecar lost = %+v, want a discard that says why", res)
	}
	must(t, b.ResumeLazy(ctx, e.rr.open))
	dir := mustMount(t, b, "build-3", "ns/c")
	if got, err := os.ReadFile(filepath.Join(dir, "big.bin")); err != nil || !bytes.Equal(got, e.big) {
		t.Errorf("big.bin after the resume: %d bytes, %v", len(got), err)
	}
	waitComplete(t, &e.f)
	if res, err := b.End(ctx, "build-3", EndOptions{}); err != nil || res.FailedRead != "" {
		t.Errorf("End of the volume mounted after the resume = %+v, %v", res, err)
	}
	assertNoOrphans(t, b)
}

// TestLazyfsEndAfterSettle: a volume mounted while its layer was partial
// reads it through the layer's lazyfs file even once it settled; if the
// process serving that file ends (the sidecar restarts, or the agent
// without one), the volume's reads fail from then on, and its End
// discards it. A volume mounted after the settle reads the image's own
// mount and is committed. Needs root.
func TestLazyfsEndAfterSettle(t *testing.T) {
	for _, sidecar := range []bool{true, false} {
		t.Run(fmt.Sprintf("sidecar=%v", sidecar), func(t *testing.T) {
			ctx := context.Background()
			e := newLazyEnv(t, 5*time.Millisecond)
			opts := e.opts
			opts.Root, opts.LazyfsSidecar = t.TempDir(), sidecar
			cfg := LazyfsSidecar(opts.Root)
			var sc *lazyfs.Sidecar
			if sidecar {
				var err error
				sc, err = lazyfs.ServeSidecar(cfg, testr.New(t).WithName("sidecar"))
				must(t, err)
				t.Cleanup(func() { must(t, sc.Close()) })
			}
			b := newTestStore(t, opts)
			syncLazy(t, b, e.chain, e.rr, 0)
			mustMount(t, b, "before", "ns/c")
			waitComplete(t, &e.f)
			mustMount(t, b, "after", "ns/c")

			if sidecar { // the sidecar restarts under the same agent
				must(t, sc.Close())
				var err error
				sc, err = lazyfs.ServeSidecar(cfg, testr.New(t).WithName("sidecar-2"))
				must(t, err)
			} else { // the agent restarts, and its lazyfs ends with it
				must(t, b.Close())
				b = newTestStore(t, opts)
			}
			res, err := b.End(ctx, "before", EndOptions{})
			must(t, err)
			if res.Kept || !strings.Contains(res.FailedRead, "no longer serves") {
				t.Errorf("End of the volume mounted before the settle = %+v, want a discard that says why", res)
			}
			if res, err := b.End(ctx, "after", EndOptions{}); err != nil || !res.Kept || res.FailedRead != "" {
				t.Errorf("End of the volume mounted after the settle = %+v, %v; want a commit", res, err)
			}
		})
	}
}

// dropPages drops the clean cached pages of the file at path.
func dropPages(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	must(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
}
