package remote

import (
	"bytes"
	"encoding/binary"
	"io"
)

// runsWriter writes a zstd frame of raw and RLE blocks only: a run of one
// byte value (the holes of sparse files, block padding, the 0xff map of
// an image's unmapped chunks) becomes a four-byte block, and everything
// else goes as it is. Any zstd reader reads it, at the speed of a copy.
//
// A pull writes the image to disk uncompressed, so that the kernel can
// mount it: compressing the rest for the way saves registry bytes but
// not the receiving disk's, and costs a decompression on the path a build
// waits on. `make bench` measures both (README, "Caches across nodes").
type runsWriter struct {
	w       io.Writer
	buf     []byte // up to one block of input not yet written
	started bool
	err     error
}

const (
	zstdMagic32 = 0xFD2FB528
	// runsWindow is the frame's declared window (1 MiB: descriptor
	// exponent 10); blocks are at most 128 KiB, the format's limit.
	runsWindowDescriptor = 10 << 3
	runsBlock            = 128 << 10
	// runsPiece is the granularity at which runs are found: the image's
	// block size.
	runsPiece = 4 << 10

	blockRaw = 0
	blockRLE = 1
)

func newRunsWriter(w io.Writer) *runsWriter {
	return &runsWriter{w: w, buf: make([]byte, 0, runsBlock)}
}

func (r *runsWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && r.err == nil {
		take := min(runsBlock-len(r.buf), len(p))
		r.buf = append(r.buf, p[:take]...)
		p = p[take:]
		if len(r.buf) == runsBlock {
			r.flush(false)
		}
	}
	if r.err != nil {
		return 0, r.err
	}
	return n, nil
}

// Close writes what is left as the frame's last block.
func (r *runsWriter) Close() error {
	r.flush(true)
	return r.err
}

// flush writes the buffered input as blocks: runs of pieces that are one
// repeated byte as RLE blocks, the rest as raw blocks.
func (r *runsWriter) flush(last bool) {
	if !r.started {
		// Frame header descriptor 0: no content size, not a single
		// segment (so a window descriptor follows), no checksum, no
		// dictionary.
		var hdr [6]byte
		binary.LittleEndian.PutUint32(hdr[:], zstdMagic32)
		hdr[5] = runsWindowDescriptor
		r.write(hdr[:])
		r.started = true
	}
	b := r.buf
	if len(b) == 0 && last {
		r.block(blockRaw, nil, 0, true)
	}
	for start := 0; start < len(b); {
		end, rle := start+min(runsPiece, len(b)-start), isRun(b[start:min(start+runsPiece, len(b))])
		for end < len(b) {
			next := min(end+runsPiece, len(b))
			if isRun(b[end:next]) != rle || (rle && b[end] != b[start]) {
				break
			}
			end = next
		}
		final := last && end == len(b)
		if rle {
			r.block(blockRLE, b[start:start+1], end-start, final)
		} else {
			r.block(blockRaw, b[start:end], end-start, final)
		}
		start = end
	}
	r.buf = r.buf[:0]
}

// isRun tells whether p is one byte value repeated.
func isRun(p []byte) bool {
	return len(p) > 0 && bytes.Equal(p[1:], p[:len(p)-1])
}

func (r *runsWriter) block(typ int, content []byte, size int, last bool) {
	h := uint32(size)<<3 | uint32(typ)<<1
	if last {
		h |= 1
	}
	r.write([]byte{byte(h), byte(h >> 8), byte(h >> 16)})
	r.write(content)
}

func (r *runsWriter) write(p []byte) {
	if r.err == nil && len(p) > 0 {
		_, r.err = r.w.Write(p)
	}
}
