package remote

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"

	seekable "github.com/SaveTheRbtz/zstd-seekable-format-go/pkg"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// A zstd layer blob is in the zstd seekable format: independent frames of
// FrameBytes of the image each (the last shorter), then a skippable frame
// holding the format's seek table. A plain zstd decoder reads it whole, as
// nodes always have; a node that mounts a layer before its bytes are here
// reads it by range, frame by frame, through the layer's Index. 1 MiB
// frames are the unit the lazy local copy fetches and verifies, and
// `make bench` (BenchmarkSeekableBlob) measured them against one zstd
// stream of the same image.
const FrameBytes = 1 << 20

// maxFrameBytes bounds the frames an index may declare, so that a frame's
// decoding takes bounded memory whatever the index says.
const maxFrameBytes = 16 << 20

// MediaTypeIndex is the media type of a layer's index blob.
const MediaTypeIndex types.MediaType = "application/vnd.layercache.layer.index.v1+json"

// Index maps a seekable layer blob's frames to the image's bytes. It is
// a blob of its own whose digest the chain records beside the layer's,
// so a node reading by range trusts it, never the seek table inside the
// blob (which only a whole read verifies).
type Index struct {
	// FrameBytes is the image's bytes in each frame but the last.
	FrameBytes int64 `json:"frameBytes"`
	// ImageBytes is the uncompressed image's size.
	ImageBytes int64   `json:"imageBytes"`
	Frames     []Frame `json:"frames"`
}

// Frame is one frame of a seekable blob.
type Frame struct {
	// Offset and Size are the frame's compressed bytes in the blob.
	Offset int64 `json:"offset"`
	Size   int64 `json:"size"`
	// Digest is the sha256 of the frame's uncompressed bytes.
	Digest string `json:"digest"`
}

// frameEncoder compresses each frame on its own, with the settings of a
// stream (compress.go): the fastest level, and a window that a frame of
// at most FrameBytes stays within.
func frameEncoder() (*zstd.Encoder, error) {
	return zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(encoderWindow))
}

// hashingEncoder hashes each frame where it is compressed, on the
// encoding goroutines (one per core): on the goroutine that hands frames
// out, it cost about a tenth of the push's throughput on two cores
// (BenchmarkSeekableBlob, 0.82x a stream's, 0.94x here). Frames are told apart
// by their buffer, which is not reused before the frame is written.
type hashingEncoder struct {
	enc  *zstd.Encoder
	mu   sync.Mutex
	sums map[*byte][sha256.Size]byte
}

func (h *hashingEncoder) EncodeAll(src, dst []byte) []byte {
	sum := sha256.Sum256(src) // src is never empty: seekable skips empty frames
	h.mu.Lock()
	h.sums[&src[0]] = sum
	h.mu.Unlock()
	return h.enc.EncodeAll(src, dst)
}

// take returns and forgets the sum of the frame in buf.
func (h *hashingEncoder) take(buf []byte) [sha256.Size]byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	sum := h.sums[&buf[0]]
	delete(h.sums, &buf[0])
	return sum
}

// seekableWriter cuts what is written to it into frames of FrameBytes and
// compresses them in parallel (seekable.Writer.WriteMany, one frame per
// core), written in order; Close writes the seek table. It records the
// index on the way: each frame's sha256 and its place in the blob as it
// is written.
type seekableWriter struct {
	enc    *hashingEncoder
	buf    []byte
	frames chan []byte
	free   chan []byte
	// stopped is closed when the compressing goroutine ends, so that a
	// Write after a failure does not wait forever for it.
	stopped chan struct{}
	err     error

	mu      sync.Mutex
	pending map[int64][]byte // frames handed out, by ID, until written
	index   Index
}

func newSeekableWriter(w io.Writer) (*seekableWriter, error) {
	enc, err := frameEncoder()
	if err != nil {
		return nil, err
	}
	hashing := &hashingEncoder{enc: enc, sums: map[*byte][sha256.Size]byte{}}
	sw, err := seekable.NewWriter(w, hashing)
	if err != nil {
		enc.Close()
		return nil, err
	}
	s := &seekableWriter{
		enc:     hashing,
		frames:  make(chan []byte, 2),
		free:    make(chan []byte, 8),
		stopped: make(chan struct{}),
		pending: map[int64][]byte{},
		index:   Index{FrameBytes: FrameBytes},
	}
	s.buf = s.newBuf()
	go s.run(sw)
	return s, nil
}

func (s *seekableWriter) run(sw *seekable.Writer) {
	err := sw.WriteMany(context.Background(), s.next, seekable.WithWriteCallback(s.written))
	if err == nil {
		err = sw.Close()
	}
	s.enc.enc.Close()
	s.err = err
	close(s.stopped)
}

func (s *seekableWriter) newBuf() []byte {
	select {
	case b := <-s.free:
		return b[:0]
	default:
		return make([]byte, 0, FrameBytes)
	}
}

// next hands WriteMany the next frame (nil at the end).
func (s *seekableWriter) next() ([]byte, error) {
	frame, ok := <-s.frames
	if !ok {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending[int64(len(s.index.Frames))] = frame
	s.index.Frames = append(s.index.Frames, Frame{})
	s.index.ImageBytes += int64(len(frame))
	return frame, nil
}

// written records where frame e went and frees its buffer.
func (s *seekableWriter) written(e seekable.FrameOffsetEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	buf := s.pending[e.ID]
	delete(s.pending, e.ID)
	sum := s.enc.take(buf)
	f := &s.index.Frames[e.ID]
	f.Offset, f.Size = int64(e.CompressedOffset), int64(e.CompressedSize)
	f.Digest = "sha256:" + hex.EncodeToString(sum[:])
	select {
	case s.free <- buf:
	default:
	}
}

func (s *seekableWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		take := min(FrameBytes-len(s.buf), len(p))
		s.buf = append(s.buf, p[:take]...)
		p = p[take:]
		if len(s.buf) == FrameBytes {
			if err := s.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (s *seekableWriter) flush() error {
	select {
	case s.frames <- s.buf:
		s.buf = s.newBuf()
		return nil
	case <-s.stopped:
		return errors.Join(errSinkFailed, s.err)
	}
}

// Close writes the last frame and the seek table.
func (s *seekableWriter) Close() error {
	var err error
	if len(s.buf) > 0 {
		err = s.flush()
	}
	close(s.frames)
	<-s.stopped
	return errors.Join(err, s.err)
}

// Index is the blob's index, once Close has returned without error.
func (s *seekableWriter) Index() *Index {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := s.index
	return &idx
}

// validate checks what a node relies on before it reads by range: the
// frames cover the image in order, each bounded, each with a digest.
// The index's own digest is already verified; this refuses one that a
// buggy or hostile pusher made well-hashed but wrong.
func (idx *Index) validate() error {
	if idx.FrameBytes <= 0 || idx.FrameBytes > maxFrameBytes {
		return fmt.Errorf("frame size %d is out of bounds (want 1 to %d bytes)", idx.FrameBytes, maxFrameBytes)
	}
	if idx.ImageBytes < 0 {
		return fmt.Errorf("image size %d is negative", idx.ImageBytes)
	}
	if want := (idx.ImageBytes + idx.FrameBytes - 1) / idx.FrameBytes; int64(len(idx.Frames)) != want {
		return fmt.Errorf("%d frames for a %d-byte image in frames of %d: want %d", len(idx.Frames), idx.ImageBytes, idx.FrameBytes, want)
	}
	var next int64
	for i, f := range idx.Frames {
		if err := f.validate(next, idx.maxCompressed()); err != nil {
			return fmt.Errorf("frame %d: %w", i, err)
		}
		next = f.Offset + f.Size
	}
	return nil
}

// maxCompressed bounds a frame's compressed size: zstd's worst case for
// incompressible bytes is a little over their size (raw blocks and their
// headers), well inside this.
func (idx *Index) maxCompressed() int64 { return idx.FrameBytes + idx.FrameBytes/16 + 4096 }

func (f Frame) validate(offset, maxSize int64) error {
	if f.Offset != offset {
		return fmt.Errorf("starts at blob byte %d, want %d (frames must be contiguous, in order, from 0)", f.Offset, offset)
	}
	if f.Size <= 0 || f.Size > maxSize {
		return fmt.Errorf("compressed size %d is out of bounds (want 1 to %d bytes)", f.Size, maxSize)
	}
	hexDigest, ok := stripSHA256(f.Digest)
	if !ok || len(hexDigest) != sha256.Size*2 {
		return fmt.Errorf("digest %q is not valid (want sha256:<64 lower-case hex>)", f.Digest)
	}
	return nil
}

func stripSHA256(digest string) (string, bool) {
	const prefix = "sha256:"
	if len(digest) < len(prefix) || digest[:len(prefix)] != prefix {
		return "", false
	}
	for _, c := range digest[len(prefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return digest[len(prefix):], true
}

// frameRange is frame i's image bytes [start, end).
func (idx *Index) frameRange(i int) (start, end int64) {
	start = int64(i) * idx.FrameBytes
	return start, min(start+idx.FrameBytes, idx.ImageBytes)
}
