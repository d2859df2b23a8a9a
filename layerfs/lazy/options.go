package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/opencontainers/go-digest"
)

// Fetch returns the image's bytes [off, off+n). The caller's implementation
// does the range request (and the decompression); it may fail transiently,
// and a File retries it.
type Fetch func(ctx context.Context, off, n int64) (io.ReadCloser, error)

var (
	// ErrUnavailable is wrapped by the error of a read (or a Fill) whose
	// chunk could not be fetched within Options.Wait.
	ErrUnavailable = errors.New("image bytes unavailable")
	// ErrCorrupt is wrapped by the error of a fetch whose bytes are not
	// the image's: a chunk that fails its digest, a body longer than asked,
	// a complete copy that fails the image's digest. Fetching again would
	// give the same bytes, so it is not retried.
	ErrCorrupt = errors.New("image bytes corrupt")
)

// Options describe the image a File copies and how it fetches it.
type Options struct {
	// Path is the local copy, written sparsely; its progress is kept
	// beside it (Path+".state").
	Path string
	// Size is the image's size in bytes (> 0).
	Size int64
	// ChunkSize is the unit of fetching and of progress: a power of two
	// from 4 KiB to 64 MiB; 0 means 1 MiB.
	ChunkSize int64
	// Fetch fetches a range of the image.
	Fetch Fetch
	// ChunkDigests, if set, are each chunk's sha256 (one per chunk): a
	// chunk counts only once its bytes match.
	ChunkDigests []digest.Digest
	// Digest, if set, is the whole image's sha256, checked when the copy is
	// complete: on a mismatch Fill fails with ErrCorrupt and the copy never
	// counts as complete.
	Digest digest.Digest
	// Wait is how long a read retries a chunk whose fetch fails (with
	// backoff) before it fails with ErrUnavailable; 0 means 30 s.
	Wait time.Duration
	// Parallel is how many chunks Fill fetches at once; 0 means 4.
	Parallel int
	// Prefetch are chunk indexes that Fill fetches first, in this order:
	// the ReadOrder of the previous node's first build.
	Prefetch []int

	// syncEvery is how many fetched bytes a File lets pile up before it
	// fsyncs the copy and records them; 0 means defaultSyncEvery. Tests
	// make it small to crash between records.
	syncEvery int64
}

const (
	defaultChunkSize = 1 << 20
	minChunkSize     = 4 << 10
	maxChunkSize     = 64 << 20 // each fetch holds a chunk in memory
	defaultWait      = 30 * time.Second
	defaultParallel  = 4
	maxParallel      = 64
	// defaultSyncEvery bounds what a crash loses (fetched again) and makes
	// a fill cost one fsync per 64 MiB, not one per chunk.
	defaultSyncEvery = 64 << 20
	// syncInterval bounds how long fetched chunks stay unrecorded when
	// they come slowly (reads one at a time).
	syncInterval = time.Second
)

// normalized returns o with its defaults filled in, or an error naming the
// value that is wrong and what it must be.
func (o Options) normalized() (Options, error) {
	if o.Path == "" {
		return o, errors.New("lazy: Options.Path is empty: set it to the local copy's path")
	}
	if o.Size <= 0 {
		return o, fmt.Errorf("lazy: Options.Size %d of %s: want the image's size in bytes (> 0)", o.Size, o.Path)
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = defaultChunkSize
	}
	if o.ChunkSize < minChunkSize || o.ChunkSize > maxChunkSize || o.ChunkSize&(o.ChunkSize-1) != 0 {
		return o, fmt.Errorf("lazy: Options.ChunkSize %d of %s: want a power of two from %d to %d (or 0 for 1 MiB)", o.ChunkSize, o.Path, minChunkSize, maxChunkSize)
	}
	if o.Fetch == nil {
		return o, fmt.Errorf("lazy: Options.Fetch of %s is nil: set it to the blob's range request", o.Path)
	}
	chunks := chunkCount(o.Size, o.ChunkSize)
	if err := o.checkDigests(chunks); err != nil {
		return o, err
	}
	switch {
	case o.Wait < 0:
		return o, fmt.Errorf("lazy: Options.Wait %s of %s: want a duration >= 0 (0 for %s)", o.Wait, o.Path, defaultWait)
	case o.Wait == 0:
		o.Wait = defaultWait
	}
	switch {
	case o.Parallel < 0 || o.Parallel > maxParallel:
		return o, fmt.Errorf("lazy: Options.Parallel %d of %s: want 1 to %d (or 0 for %d)", o.Parallel, o.Path, maxParallel, defaultParallel)
	case o.Parallel == 0:
		o.Parallel = defaultParallel
	}
	for i, c := range o.Prefetch {
		if c < 0 || c >= chunks {
			return o, fmt.Errorf("lazy: Options.Prefetch[%d] = %d of %s: want a chunk index from 0 to %d (the image has %d chunks of %d bytes; was the list recorded with another chunk size?)", i, c, o.Path, chunks-1, chunks, o.ChunkSize)
		}
	}
	if o.syncEvery <= 0 {
		o.syncEvery = defaultSyncEvery
	}
	return o, nil
}

func (o Options) checkDigests(chunks int) error {
	if o.ChunkDigests != nil && len(o.ChunkDigests) != chunks {
		return fmt.Errorf("lazy: Options.ChunkDigests of %s has %d digests: want one per chunk, %d (size %d in chunks of %d)", o.Path, len(o.ChunkDigests), chunks, o.Size, o.ChunkSize)
	}
	for i, d := range o.ChunkDigests {
		if err := checkSHA256(d); err != nil {
			return fmt.Errorf("lazy: Options.ChunkDigests[%d] of %s: %w", i, o.Path, err)
		}
	}
	if o.Digest != "" {
		if err := checkSHA256(o.Digest); err != nil {
			return fmt.Errorf("lazy: Options.Digest of %s: %w", o.Path, err)
		}
	}
	return nil
}

func checkSHA256(d digest.Digest) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%q: %w (want sha256:<64 hex digits>)", d, err)
	}
	if d.Algorithm() != digest.SHA256 {
		return fmt.Errorf("%q: want a sha256 digest, not %s", d, d.Algorithm())
	}
	return nil
}

func chunkCount(size, chunkSize int64) int {
	return int((size + chunkSize - 1) / chunkSize)
}
