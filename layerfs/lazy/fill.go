package lazy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"
)

// Fill fetches every chunk the copy lacks, Options.Prefetch first, then in
// order, Parallel at a time, recording progress as it goes. It returns nil
// once the copy is complete (and matched Options.Digest), an error
// wrapping ErrUnavailable when a chunk could not be fetched within
// Options.Wait (call it again later), or one wrapping ErrCorrupt. Reads go
// on meanwhile; a read's chunk is fetched at once, beside Fill's.
func (f *File) Fill(ctx context.Context) error {
	if err := f.begin(); err != nil {
		return err
	}
	defer f.ops.Done()
	f.fillMu.Lock()
	defer f.fillMu.Unlock()
	ctx, stop := f.withClose(ctx)
	defer stop()
	sum := f.digestBeside(ctx)
	err := f.fetchAll(ctx, f.fillOrder())
	if perr := f.persist(); err == nil {
		err = perr
	}
	if err != nil {
		stop() // and wait for the digest to stop, before the copy may close
		if sum != nil {
			sum()
		}
		return err
	}
	return f.verify(sum)
}

// fillOrder is Prefetch, then every other chunk in order, less what the
// copy holds.
func (f *File) fillOrder() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	queued := f.have.clone()
	var order []int
	for _, c := range append(append([]int(nil), f.o.Prefetch...), seq(f.chunks)...) {
		if !queued.has(c) {
			queued.add(c)
			order = append(order, c)
		}
	}
	return order
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// fetchAll fetches the chunks of order, Parallel at a time; the first
// failure stops the rest.
func (f *File) fetchAll(ctx context.Context, order []int) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(f.o.Parallel)
	for _, c := range order {
		if f.yieldToReads(gctx) != nil {
			break
		}
		g.Go(func() error { return f.ensure(gctx, c, false, time.Now().Add(f.o.Wait)) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// readQuiet is how long after a read's end Fill starts chunks again.
const readQuiet = 200 * time.Millisecond

// yieldToReads returns once no read has run for readQuiet, or when ctx
// ends (its error). Reads come first: a fill at full speed takes the
// cores and the bandwidth that a build's reads need, those of chunks in
// the copy as much as the fetches of those not yet (beside it, a build
// reading a tenth of a 1 GiB cache took 2 to 5 times the warm build plus
// the fetch of its tenth; yielding only to reads that waited on a fetch,
// the fill still ran in the gaps that reading ahead leaves). The chunks
// under way go on; a build's pauses, and its end, let the fill on.
func (f *File) yieldToReads(ctx context.Context) error {
	for {
		quiet := readQuiet
		if f.readsWaiting.Load() == 0 {
			quiet -= time.Since(time.Unix(0, f.lastRead.Load()))
		}
		if quiet <= 0 || ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
		case <-time.After(quiet):
		}
	}
}

// digestBeside starts hashing the copy in order, beside the fetches, when
// the image has a digest still to check: each chunk is hashed as soon as
// it and those before it are in the copy (from the page cache, just
// written), so the digest is known when the last chunk lands rather than
// after a second pass over the whole copy. The returned function waits for
// it.
func (f *File) digestBeside(ctx context.Context) func() (digest.Digest, error) {
	f.mu.Lock()
	done := f.o.Digest == "" || f.verified
	f.mu.Unlock()
	if done {
		return nil
	}
	var sum digest.Digest
	var err error
	end := make(chan struct{})
	go func() {
		defer close(end)
		sum, err = f.digestInOrder(ctx)
	}()
	return func() (digest.Digest, error) { <-end; return sum, err }
}

// digestInOrder hashes the copy's chunks in order, each once it is in;
// it ends once all are or ctx is done.
func (f *File) digestInOrder(ctx context.Context) (digest.Digest, error) {
	h := sha256.New()
	bp := f.bufs.Get().(*[]byte)
	defer f.bufs.Put(bp)
	for next := 0; next < f.chunks; {
		f.mu.Lock()
		in := f.have.has(next)
		f.mu.Unlock()
		if !in {
			select {
			case <-f.added:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			continue
		}
		off, n := f.chunkRange(next)
		if _, err := f.f.ReadAt((*bp)[:n], off); err != nil {
			return "", fmt.Errorf("lazy: read the copy %s to check its digest: %w", f.o.Path, err)
		}
		h.Write((*bp)[:n])
		next++
	}
	return digest.NewDigest(digest.SHA256, h), nil
}

// verify checks the complete copy's digest (sum, nil when there is
// none to check) against Options.Digest: a copy that matched is recorded
// so, and never hashed again.
func (f *File) verify(sum func() (digest.Digest, error)) error {
	if sum == nil {
		return nil
	}
	got, err := sum()
	if err != nil {
		return err
	}
	if got != f.o.Digest {
		return fmt.Errorf("lazy: the complete copy %s is %s, want %s (was the image published with another digest, or its chunks with no digests?): %w", f.o.Path, got, f.o.Digest, ErrCorrupt)
	}
	f.mu.Lock()
	f.verified = true
	f.mu.Unlock()
	return f.persist()
}
