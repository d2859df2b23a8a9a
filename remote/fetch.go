package remote

import (
	"context"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
)

// Fetch opens layer digest's decompressed content. The blob is verified
// as it is read: a stream whose bytes do not match digest fails at its
// end, before the caller can take the layer as whole. A blob longer than
// size bytes (the size the chain states; 0 for no bound) fails as soon as
// it is, so a hostile registry cannot stream forever.
func (t *Target) Fetch(ctx context.Context, digest string, size int64) (io.ReadCloser, error) {
	rc, err := t.FetchCompressed(ctx, digest)
	if err != nil {
		return nil, err
	}
	if size <= 0 {
		return decompress(rc)
	}
	bounded := &boundedReader{rc: rc, left: size, size: size, digest: digest}
	zr, err := decompress(bounded)
	if err != nil {
		return nil, err
	}
	return overrunFirst{zr, bounded}, nil
}

// overrunFirst reports a blob longer than its bound as such: a zstd
// decoder cut off inside a skippable frame (a seekable blob's seek table)
// says only "unexpected EOF".
type overrunFirst struct {
	io.ReadCloser
	bounded *boundedReader
}

func (o overrunFirst) Read(p []byte) (int, error) {
	n, err := o.ReadCloser.Read(p)
	if err != nil && err != io.EOF && o.bounded.overrun != nil {
		err = o.bounded.overrun
	}
	return n, err
}

// boundedReader fails a blob that runs past its stated size.
type boundedReader struct {
	rc      io.ReadCloser
	left    int64
	size    int64
	digest  string
	overrun error
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a longer blob from one that ends here.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n > 0 {
			b.overrun = fmt.Errorf("layer blob %s is longer than the %d bytes its chain states: refused", b.digest, b.size)
			return 0, b.overrun
		}
		if err == nil {
			err = io.ErrNoProgress
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedReader) Close() error { return b.rc.Close() }

// FetchCompressed opens layer digest's blob as the registry holds it,
// verified as it is read.
func (t *Target) FetchCompressed(ctx context.Context, digest string) (io.ReadCloser, error) {
	h, err := v1.NewHash(digest)
	if err != nil {
		return nil, fmt.Errorf("layer digest %q is not valid (want sha256:<64 hex>): %w", digest, err)
	}
	layer, err := ggcr.Layer(t.Repository.Digest(h.String()), t.options(ggcr.WithContext(ctx))...)
	if err != nil {
		return nil, fmt.Errorf("layer %s in %s: %w", digest, t.Repository, err)
	}
	rc, err := layer.Compressed()
	if err != nil {
		return nil, fmt.Errorf("fetch layer %s from %s: %w", digest, t.Repository, err)
	}
	return rc, nil
}
