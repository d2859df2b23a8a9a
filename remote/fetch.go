package remote

import (
	"context"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
)

// Fetch opens layer digest's uncompressed tar. The blob is verified as it
// is read: a stream whose bytes do not match digest fails at its end,
// before the caller can take the layer as whole.
func (t *Target) Fetch(ctx context.Context, digest string) (io.ReadCloser, error) {
	rc, err := t.FetchCompressed(ctx, digest)
	if err != nil {
		return nil, err
	}
	return decompress(rc)
}

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
