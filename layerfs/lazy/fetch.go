package lazy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/erofs"
	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/receive"
)

// The backoff between fetches of a failing chunk: short first, as most
// failures are a moment's (a registry's restart, a dropped connection),
// and bounded so that a read notices the registry's return within 2 s.
const (
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 2 * time.Second
)

// ensure returns once chunk c is in the copy: it fetches it, or waits for
// the fetch under way (whoever started it), and tries again with backoff
// until deadline, past which the chunk is ErrUnavailable. A corrupt chunk
// fails at once: fetching it again gives the same bytes.
func (f *File) ensure(ctx context.Context, c int, forRead bool, deadline time.Time) error {
	backoff := firstBackoff
	var last error
	for {
		f.mu.Lock()
		if f.have.has(c) {
			f.mu.Unlock()
			return nil
		}
		a, mine := f.inflight[c], false
		if a == nil {
			a, mine = &attempt{done: make(chan struct{})}, true
			f.inflight[c] = a
		}
		f.mu.Unlock()
		if mine {
			f.fetchChunk(ctx, c, a, forRead, deadline)
		} else if err := waitUntil(ctx, a.done, deadline); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("lazy: fetch chunk %d of %s: %w", c, f.o.Path, err)
			}
			return f.unavailable(c, errors.Join(last, errors.New("the fetch under way did not end")))
		}
		switch {
		case a.err == nil:
			return nil
		case errors.Is(a.err, ErrCorrupt):
			return a.err
		case ctx.Err() != nil:
			return fmt.Errorf("lazy: fetch chunk %d of %s: %w", c, f.o.Path, ctx.Err())
		case a.abandoned: // another caller gave up: not the registry's failure
			continue
		}
		last = a.err
		if mine {
			f.mu.Lock()
			f.stats.Retries++
			f.mu.Unlock()
		}
		if waitUntil(ctx, time.After(backoff), deadline) != nil {
			return f.unavailable(c, last)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// waitUntil waits for ready, or fails once ctx is done or deadline passes.
func waitUntil[T any](ctx context.Context, ready <-chan T, deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return context.DeadlineExceeded
	}
}

func (f *File) unavailable(c int, last error) error {
	off, n := f.chunkRange(c)
	return fmt.Errorf("lazy: bytes [%d, %d) of %s (chunk %d) not fetched within %s: %w: %w", off, off+n, f.o.Path, c, f.o.Wait, ErrUnavailable, last)
}

// fetchChunk makes attempt a: one fetch of chunk c into the copy, bounded
// by deadline, whose outcome every waiter of a sees.
func (f *File) fetchChunk(ctx context.Context, c int, a *attempt, forRead bool, deadline time.Time) {
	actx, cancel := context.WithDeadline(ctx, deadline)
	n, err := f.fetchOnce(actx, c)
	cancel()
	f.mu.Lock()
	delete(f.inflight, c)
	switch {
	case err == nil:
		f.have.add(c)
		if forRead {
			f.stats.OnDemandBytes += n
		} else {
			f.stats.BackgroundBytes += n
		}
	case ctx.Err() != nil:
		a.abandoned = true
	}
	a.err = err
	unrecorded := int64(f.have.count-f.recorded) * f.o.ChunkSize
	f.mu.Unlock()
	close(a.done)
	if err == nil {
		wake(f.added)
	}
	if unrecorded >= f.o.syncEvery {
		wake(f.kick)
	}
}

// wake signals c without blocking: one signal pending is enough.
func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (f *File) chunkRange(c int) (off, n int64) {
	off = int64(c) * f.o.ChunkSize
	return off, min(f.o.ChunkSize, f.o.Size-off)
}

// fetchOnce fetches chunk c, checks it and writes it to the copy.
func (f *File) fetchOnce(ctx context.Context, c int) (int64, error) {
	off, n := f.chunkRange(c)
	bp := f.bufs.Get().(*[]byte)
	defer f.bufs.Put(bp)
	buf := (*bp)[:n+1]
	got, err := f.get(ctx, off, buf)
	if err != nil {
		return 0, fmt.Errorf("lazy: fetch bytes [%d, %d) of %s (chunk %d): %w", off, off+n, f.o.Path, c, err)
	}
	data := buf[:got]
	if f.o.ChunkDigests != nil {
		if d := digest.SHA256.FromBytes(data); d != f.o.ChunkDigests[c] {
			return 0, fmt.Errorf("lazy: bytes [%d, %d) of %s (chunk %d) are %s, want %s: %w", off, off+n, f.o.Path, c, d, f.o.ChunkDigests[c], ErrCorrupt)
		}
	}
	if err := f.write(c, off, data); err != nil {
		return 0, fmt.Errorf("lazy: write bytes [%d, %d) of the copy %s: %w", off, off+n, f.o.Path, err)
	}
	return n, nil
}

// get reads the range of len(buf)-1 bytes at off into buf: a body that
// ends early is an error (tried again), one longer than asked is not the
// range (a server that ignored Range: corrupt, it would do so again).
func (f *File) get(ctx context.Context, off int64, buf []byte) (int, error) {
	n := len(buf) - 1
	body, err := f.o.Fetch(ctx, off, int64(n))
	if err != nil {
		return 0, err
	}
	if body == nil {
		return 0, errors.New("Fetch returned no body and no error")
	}
	defer body.Close()
	got, err := io.ReadFull(io.LimitReader(body, int64(n+1)), buf)
	switch {
	case got > n:
		return 0, fmt.Errorf("the body is longer than the %d bytes asked (does the server honour Range?): %w", n, ErrCorrupt)
	case got < n && (err == io.ErrUnexpectedEOF || err == io.EOF):
		return 0, fmt.Errorf("short body: %d of %d bytes", got, n)
	case err != io.ErrUnexpectedEOF:
		return 0, fmt.Errorf("read the body after %d of %d bytes: %w", got, n, err)
	}
	return got, nil
}

// write puts chunk c's bytes at off in the copy, leaving long runs of
// zeros as holes (receive.SparseWriter), which the copy's holes already
// read as, unless a crash or a failed write may have left other bytes
// there: then the chunk's range is punched first.
func (f *File) write(c int, off int64, p []byte) (err error) {
	f.mu.Lock()
	stale := f.stale.has(c)
	f.mu.Unlock()
	defer func() {
		if err != nil {
			f.mu.Lock()
			f.stale.add(c)
			f.mu.Unlock()
		}
	}()
	if stale {
		err := unix.Fallocate(int(f.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, int64(len(p)))
		if err != nil { // a filesystem without holes: every byte written
			_, err = f.f.WriteAt(p, off)
			ondisk.FaultPoint()
			return err
		}
	}
	whole := len(p) / erofs.BlockSize * erofs.BlockSize
	if _, err := receive.NewSparseWriter(f.f, off).Write(p[:whole]); err != nil {
		return err
	}
	if tail := p[whole:]; !allZero(tail) { // only the image's last chunk has a partial block
		if _, err := f.f.WriteAt(tail, off+int64(whole)); err != nil {
			return err
		}
	}
	ondisk.FaultPoint()
	return nil
}

func allZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeros))
		if !bytes.Equal(p[:n], zeros[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

var zeros = make([]byte, erofs.BlockSize)
