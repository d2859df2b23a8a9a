package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// File is a layer image's local copy, filled on demand (ReadAt) and in the
// background (Fill). Its methods are safe for concurrent use.
type File struct {
	o      Options
	f      *os.File
	chunks int
	bufs   sync.Pool // chunk buffers (ChunkSize+1: one byte more shows a long body)

	ctx    context.Context // done at Close
	cancel context.CancelFunc
	ops    sync.WaitGroup // ReadAt, Fill and the sync loop: what Close waits for
	fillMu sync.Mutex     // one Fill at a time
	kick   chan struct{}  // wakes the sync loop once enough is unrecorded
	added  chan struct{}  // wakes Fill's digest of the copy: a chunk is in

	mu        sync.Mutex
	closed    bool
	have      *bitset // chunks whose (checked) bytes are in the copy
	stale     *bitset // chunks the copy may hold other bytes for (a lost record, a failed write)
	recorded  int     // have's count when last recorded
	verified  bool    // the complete copy matched Options.Digest
	recordedV bool    // verified when last recorded
	inflight  map[int]*attempt
	readSeen  *bitset
	readOrder []int
	stats     Stats

	syncMu sync.Mutex // one record at a time, in order

	// Reads waiting on fetches now, and when the last read ended (unix
	// nanoseconds): Fill yields to them (yieldToReads).
	readsWaiting atomic.Int32
	lastRead     atomic.Int64
}

// Stats are what a File fetched and what its reads waited for.
type Stats struct {
	OnDemandBytes   int64   // fetched for reads
	BackgroundBytes int64   // fetched by Fill
	Stalls          int64   // reads that waited for a fetch
	StallSeconds    float64 // the time those reads waited, in all
	Retries         int64   // failed fetches tried again
	Chunks          int     // the image's chunks
	LocalChunks     int     // of them, in the copy
}

// attempt is one fetch of one chunk; whoever needs the chunk meanwhile
// waits for it rather than fetching it again.
type attempt struct {
	done      chan struct{}
	err       error // set before done is closed
	abandoned bool  // the fetcher's context ended: not the registry's failure
}

// Open creates the copy that opts describe, or reopens it keeping every
// chunk its state file records. A state file that is not of this image
// (another size, chunk size, chunk count or digest, or unreadable) is not
// trusted: the copy starts over.
func Open(opts Options) (*File, error) {
	o, err := opts.normalized()
	if err != nil {
		return nil, err
	}
	fl, err := os.OpenFile(o.Path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lazy: open the copy %s: %w", o.Path, err)
	}
	f := &File{o: o, f: fl, chunks: chunkCount(o.Size, o.ChunkSize), kick: make(chan struct{}, 1), added: make(chan struct{}, 1), inflight: map[int]*attempt{}}
	f.bufs.New = func() any { b := make([]byte, o.ChunkSize+1); return &b }
	if err := f.load(); err != nil {
		fl.Close()
		return nil, err
	}
	f.readSeen = newBitset(f.chunks)
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.ops.Add(1)
	go f.syncLoop()
	return f, nil
}

// load takes the chunks the state file records, or starts the copy over.
func (f *File) load() error {
	have, verified, _ := loadState(f.o)
	if st, err := f.f.Stat(); err == nil && have != nil && st.Size() == f.o.Size {
		f.have, f.verified, f.recorded, f.recordedV = have, verified, have.count, verified
		f.stale = newBitset(f.chunks)
		for c := range f.chunks {
			if !have.has(c) { // a crash may have left some of its bytes
				f.stale.add(c)
			}
		}
		return nil
	}
	return f.startOver()
}

// startOver forgets the state file first (so no crash leaves a record of
// bytes that are gone), then empties the copy to Size of holes.
func (f *File) startOver() error {
	ondisk.FaultPoint()
	switch err := os.Remove(statePath(f.o.Path)); {
	case err == nil:
		if err := ondisk.SyncDir(filepath.Dir(f.o.Path)); err != nil {
			return fmt.Errorf("lazy: forget the untrusted state file of %s: %w", f.o.Path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("lazy: remove the untrusted state file of %s: %w", f.o.Path, err)
	}
	if err := f.f.Truncate(0); err != nil {
		return fmt.Errorf("lazy: empty the copy %s: %w", f.o.Path, err)
	}
	if err := f.f.Truncate(f.o.Size); err != nil {
		return fmt.Errorf("lazy: size the copy %s to %d bytes (is the disk full?): %w", f.o.Path, f.o.Size, err)
	}
	f.have, f.stale = newBitset(f.chunks), newBitset(f.chunks)
	return nil
}

// begin registers an operation that Close waits for.
func (f *File) begin() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("lazy: %s is closed", f.o.Path)
	}
	f.ops.Add(1)
	return nil
}

// withClose is ctx, also done once the File is closed.
func (f *File) withClose(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(f.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// ReadAt reads the image's bytes [off, off+len(p)) into p, fetching first
// the chunks of that range that are not in the copy. Like os.File.ReadAt,
// a read that reaches the image's end returns io.EOF with what it read.
func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("lazy: read of %s at offset %d: want an offset >= 0", f.o.Path, off)
	}
	if off >= f.o.Size {
		return 0, io.EOF
	}
	end := min(off+int64(len(p)), f.o.Size)
	if end == off {
		return 0, nil
	}
	if err := f.begin(); err != nil {
		return 0, err
	}
	defer f.ops.Done()
	defer func() { f.lastRead.Store(time.Now().UnixNano()) }()
	if err := f.need(ctx, int(off/f.o.ChunkSize), int((end-1)/f.o.ChunkSize)); err != nil {
		return 0, err
	}
	n, err := f.f.ReadAt(p[:end-off], off)
	if err == nil && end < off+int64(len(p)) {
		err = io.EOF
	}
	return n, err
}

// need fetches the chunks first..last that the copy lacks, at once and
// beside Fill's, and counts the wait as a stall.
func (f *File) need(ctx context.Context, first, last int) error {
	var missing []int
	f.mu.Lock()
	sequential := first > 0 && f.readSeen.has(first-1)
	for c := first; c <= last; c++ {
		if !f.readSeen.has(c) {
			f.readSeen.add(c)
			f.readOrder = append(f.readOrder, c)
		}
		if !f.have.has(c) {
			missing = append(missing, c)
		}
	}
	f.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	if sequential {
		f.readAhead(last)
	}
	start := time.Now()
	f.readsWaiting.Add(1)
	defer func() {
		f.readsWaiting.Add(-1)
		f.mu.Lock()
		f.stats.Stalls++
		f.stats.StallSeconds += time.Since(start).Seconds()
		f.mu.Unlock()
	}()
	ctx, stop := f.withClose(ctx)
	defer stop()
	deadline := start.Add(f.o.Wait)
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range missing {
		g.Go(func() error { return f.ensure(gctx, c, true, deadline) })
	}
	return g.Wait()
}

// readAheadChunks is how many chunks past a sequential read's stall are
// fetched beside it.
const readAheadChunks = 4

// readAhead starts fetching the readAheadChunks chunks after chunk last
// that are neither in the copy nor under way, without waiting for them: a
// read that stalled where the reads before it ended goes on in order (a
// build reads a package's files one after the other, which lie one after
// the other in the image), and a reader that waits for each chunk in turn
// would pay every fetch's latency in full, where the fetches alone run
// several at once. Each is one attempt: its failure is left to the read
// that needs the chunk, which tries again.
// It runs within a read (need), whose operation keeps Close waiting
// while the fetches are added to it.
func (f *File) readAhead(last int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := last + 1; c < min(last+1+readAheadChunks, f.chunks); c++ {
		if f.have.has(c) || f.inflight[c] != nil {
			continue
		}
		a := &attempt{done: make(chan struct{})}
		f.inflight[c] = a
		f.ops.Add(1)
		go func() {
			defer f.ops.Done()
			f.fetchChunk(f.ctx, c, a, true, time.Now().Add(f.o.Wait))
		}()
	}
}

// Complete reports whether every chunk is in the copy (and, when the image
// has a digest, the copy matched it).
func (f *File) Complete() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.completeLocked()
}

func (f *File) completeLocked() bool {
	return f.have.full() && (f.o.Digest == "" || f.verified)
}

// Size is the image's size (Options.Size).
func (f *File) Size() int64 { return f.o.Size }

// Stats returns what the File fetched and what its reads waited for.
func (f *File) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stats
	s.Chunks, s.LocalChunks = f.chunks, f.have.count
	return s
}

// ReadOrder returns the chunks that reads touched, in the order they were
// first read, each once: whether Fill had fetched them yet or not, they
// are what a build read, which the next node's Fill fetches first
// (Options.Prefetch).
func (f *File) ReadOrder() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.readOrder...)
}

// Close stops Fill and the fetches of reads, records the chunks fetched so
// far and closes the copy.
func (f *File) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	f.cancel()
	f.ops.Wait()
	err := f.persist()
	return errors.Join(err, f.f.Close())
}

// syncLoop records fetched chunks once syncEvery bytes of them wait (a
// kick) or syncInterval after the last record. Its errors are not lost:
// the next record, at the end of Fill or at Close, meets them again.
func (f *File) syncLoop() {
	defer f.ops.Done()
	t := time.NewTicker(syncInterval)
	defer t.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		case <-f.kick:
		}
		_ = f.persist()
	}
}

// persist fsyncs the copy, then records the chunks that were in it before
// the fsync: a recorded chunk's bytes are always on disk.
func (f *File) persist() error {
	f.syncMu.Lock()
	defer f.syncMu.Unlock()
	f.mu.Lock()
	have, verified := f.have.clone(), f.verified
	unchanged := have.count == f.recorded && verified == f.recordedV
	f.mu.Unlock()
	if unchanged {
		return nil
	}
	if err := unix.Fdatasync(int(f.f.Fd())); err != nil {
		return fmt.Errorf("lazy: fsync the copy %s: %w", f.o.Path, err)
	}
	if err := saveState(f.o, have, verified); err != nil {
		return fmt.Errorf("lazy: record the progress of %s: %w", f.o.Path, err)
	}
	f.mu.Lock()
	f.recorded, f.recordedV = have.count, verified
	f.mu.Unlock()
	return nil
}
