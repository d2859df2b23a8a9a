package lazy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"

	"github.com/layercache/layercache/layerfs/receive"
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
	err := f.fetchAll(ctx, f.fillOrder())
	if perr := f.persist(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	return f.verify(ctx)
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
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return f.ensure(gctx, c, false, time.Now().Add(f.o.Wait)) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// verify checks the complete copy against Options.Digest, once: a copy
// that matched is recorded so.
func (f *File) verify(ctx context.Context) error {
	f.mu.Lock()
	done := f.o.Digest == "" || f.verified
	f.mu.Unlock()
	if done {
		return nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, receive.WithContext(ctx, io.NewSectionReader(f.f, 0, f.o.Size))); err != nil {
		return fmt.Errorf("lazy: read the copy %s to check its digest: %w", f.o.Path, err)
	}
	if got := digest.NewDigest(digest.SHA256, h); got != f.o.Digest {
		return fmt.Errorf("lazy: the complete copy %s is %s, want %s (was the image published with another digest, or its chunks with no digests?): %w", f.o.Path, got, f.o.Digest, ErrCorrupt)
	}
	f.mu.Lock()
	f.verified = true
	f.mu.Unlock()
	return f.persist()
}
