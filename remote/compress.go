package remote

import (
	"bufio"
	"bytes"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Compression is how layers are compressed on the way to the registry.
type Compression string

const (
	// Zstd (the fastest level) is the default: `make bench` measured it
	// faster than gzip on the push and, on the pull, faster than sending
	// the image with only its runs of zeros folded (docs/performance.md,
	// "Caches across nodes").
	Zstd Compression = "zstd"
	// Gzip is for registries that refuse zstd blobs.
	Gzip Compression = "gzip"
)

// DefaultCompression is what node agents push with unless told otherwise.
const DefaultCompression = Zstd

func (c Compression) validate() error {
	switch c {
	case Zstd, Gzip:
		return nil
	}
	return fmt.Errorf("compression %q is not known: use zstd or gzip", c)
}

// Media types of layer blobs: EROFS images (layerfs/erofs), compressed.
const (
	MediaTypeImageZstd types.MediaType = "application/vnd.layercache.layer.v1.erofs+zstd"
	MediaTypeImageGzip types.MediaType = "application/vnd.layercache.layer.v1.erofs+gzip"
)

// IsImage tells whether a layer blob of mediaType is an EROFS image, the
// only kind a node takes in.
func IsImage(mediaType string) bool {
	switch types.MediaType(mediaType) {
	case MediaTypeImageZstd, MediaTypeImageGzip:
		return true
	}
	return false
}

func (c Compression) mediaType() types.MediaType {
	if c == Gzip {
		return MediaTypeImageGzip
	}
	return MediaTypeImageZstd
}

// maxWindow bounds the memory a zstd stream can make a decoder take: a
// blob's frame header declares its window, and a hostile one declaring
// 512 MiB would get it. The encoder's window stays well below.
const (
	maxWindow     = 8 << 20
	encoderWindow = 4 << 20
)

// writer compresses into w.
func (c Compression) writer(w io.Writer) (io.WriteCloser, error) {
	if c == Gzip {
		return gzip.NewWriterLevel(w, gzip.BestSpeed)
	}
	return zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(encoderWindow))
}

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// decompress reads a layer blob whatever its compression, as a registry
// may hold layers that another node pushed with another setting.
func decompress(rc io.ReadCloser) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(rc, 64<<10)
	head, err := br.Peek(4)
	if err != nil && err != io.EOF {
		rc.Close()
		return nil, fmt.Errorf("read layer blob: %w", err)
	}
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("read gzip layer blob: %w", err)
		}
		return readCloser{zr, func() error { zr.Close(); return rc.Close() }}, nil
	case bytes.HasPrefix(head, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderMaxMemory(maxWindow*4))
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("read zstd layer blob: %w", err)
		}
		return readCloser{zr, func() error { zr.Close(); return rc.Close() }}, nil
	}
	return readCloser{br, rc.Close}, nil
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }
