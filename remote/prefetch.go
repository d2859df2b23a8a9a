package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// A prefetch list is the order in which the first build on a fresh node
// read a layer's frames: the next fresh node fetches those frames first,
// before the rest in order, so that its build finds them here. It is
// stored beside the layer, as a small blob under the tag
// prefetch-<layer digest's hex> of the cache's repository (the tag keeps
// it through garbage collection, and deleting the repository deletes
// it). It changes only the order of fetches, never what is read: every
// frame is still checked against the index. So a list is bounded and
// checked, and one that fails is ignored, not trusted.

// MediaTypePrefetch is a prefetch list blob's media type.
const MediaTypePrefetch types.MediaType = "application/vnd.layercache.prefetch.v1+json"

// Prefetch is a layer's prefetch list.
type Prefetch struct {
	// FrameBytes is the frame size the list counts in (Index.FrameBytes).
	FrameBytes int64 `json:"frameBytes"`
	// Frames are frame indexes, each once, in the order they were read.
	Frames []int `json:"frames"`
}

// maxPrefetchFrames bounds a list: the frames of a 256 GiB image in 1 MiB
// frames. maxPrefetchBytes bounds its blob: that many decimal numbers and
// commas.
const (
	maxPrefetchFrames = 256 << 10
	maxPrefetchBytes  = 64 + maxPrefetchFrames*8
)

// prefetchTag is the tag of layer digest's prefetch list.
func (t *Target) prefetchTag(layerDigest string) (name.Tag, error) {
	h, err := v1.NewHash(layerDigest)
	if err != nil {
		return name.Tag{}, fmt.Errorf("layer digest %q is not valid (want sha256:<64 hex>): %w", layerDigest, err)
	}
	return t.Repository.Tag("prefetch-" + h.Hex), nil
}

// PushPrefetch stores frames, of the layer layerDigest whose index is
// idx, as the layer's prefetch list.
func (t *Target) PushPrefetch(ctx context.Context, layerDigest string, idx *Index, frames []int) error {
	tag, err := t.prefetchTag(layerDigest)
	if err != nil {
		return err
	}
	p := Prefetch{FrameBytes: idx.FrameBytes, Frames: frames}
	if err := p.check(idx.FrameBytes, len(idx.Frames)); err != nil {
		return fmt.Errorf("prefetch list of layer %s: %w", layerDigest, err)
	}
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	list := static.NewLayer(data, MediaTypePrefetch)
	digest, err1 := list.Digest()
	size, err2 := list.Size()
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	opts := t.options(ggcr.WithContext(ctx))
	if err := ggcr.WriteLayer(t.Repository, list, opts...); err != nil {
		return fmt.Errorf("push the prefetch list of layer %s to %s: %w", layerDigest, t.Repository, err)
	}
	blobs := []Blob{{Digest: digest, DiffID: digest, Size: size, MediaType: MediaTypePrefetch}}
	config, err := imageConfig(blobs)
	if err != nil {
		return err
	}
	configLayer := static.NewLayer(config, types.OCIConfigJSON)
	if err := ggcr.WriteLayer(t.Repository, configLayer, opts...); err != nil {
		return fmt.Errorf("push the prefetch list of layer %s to %s: %w", layerDigest, t.Repository, err)
	}
	manifest, err := imageManifest(configLayer, blobs)
	if err != nil {
		return err
	}
	if err := ggcr.Put(tag, manifest, opts...); err != nil {
		return fmt.Errorf("push the prefetch list of layer %s to %s: %w", layerDigest, tag, err)
	}
	return nil
}

// FetchPrefetch reads layer layerDigest's prefetch list for an image of
// idx's frames. A layer without one has an empty list; a list that fails
// its checks (another frame size, frames out of range or repeated, too
// large) is an error, and the caller fetches in order.
func (t *Target) FetchPrefetch(ctx context.Context, layerDigest string, idx *Index) (Prefetch, error) {
	tag, err := t.prefetchTag(layerDigest)
	if err != nil {
		return Prefetch{}, err
	}
	img, err := ggcr.Image(tag, t.options(ggcr.WithContext(ctx))...)
	var te *transport.Error
	if errors.As(err, &te) && te.StatusCode == http.StatusNotFound {
		return Prefetch{}, nil
	}
	if err != nil {
		return Prefetch{}, fmt.Errorf("read the prefetch list of layer %s at %s: %w", layerDigest, tag, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return Prefetch{}, fmt.Errorf("read the prefetch list of layer %s at %s: %w", layerDigest, tag, err)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != MediaTypePrefetch || m.Layers[0].Size <= 0 || m.Layers[0].Size > maxPrefetchBytes {
		return Prefetch{}, fmt.Errorf("the prefetch list of layer %s at %s is not one %s blob of at most %d bytes: ignored", layerDigest, tag, MediaTypePrefetch, maxPrefetchBytes)
	}
	data, err := t.readBlob(ctx, m.Layers[0].Digest.String(), m.Layers[0].Size)
	if err != nil {
		return Prefetch{}, fmt.Errorf("read the prefetch list of layer %s: %w", layerDigest, err)
	}
	var p Prefetch
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Prefetch{}, fmt.Errorf("the prefetch list of layer %s at %s: %w", layerDigest, tag, err)
	}
	if err := p.check(idx.FrameBytes, len(idx.Frames)); err != nil {
		return Prefetch{}, fmt.Errorf("the prefetch list of layer %s at %s: %w", layerDigest, tag, err)
	}
	return p, nil
}

// readBlob reads blob digest whole, at most size bytes (the size stated
// for it), verified: one byte over the bound tells a longer blob from one
// that ends there, and reading to the end is what makes the digest check
// run.
func (t *Target) readBlob(ctx context.Context, digest string, size int64) ([]byte, error) {
	rc, err := t.FetchCompressed(ctx, digest)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, size+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > size {
		return nil, fmt.Errorf("blob %s is longer than the %d bytes stated for it: refused", digest, size)
	}
	return data, nil
}

// check refuses a list of another frame size than frameBytes, or whose
// frames are too many, out of [0, frames) or repeated.
func (p Prefetch) check(frameBytes int64, frames int) error {
	if p.FrameBytes != frameBytes || frameBytes <= 0 {
		return fmt.Errorf("its frames are of %d bytes, the layer's of %d", p.FrameBytes, frameBytes)
	}
	if len(p.Frames) > min(frames, maxPrefetchFrames) {
		return fmt.Errorf("it lists %d frames, more than the layer's %d", len(p.Frames), frames)
	}
	seen := make(map[int]bool, len(p.Frames))
	for i, f := range p.Frames {
		if f < 0 || f >= frames || seen[f] {
			return fmt.Errorf("frame %d (entry %d) is out of the layer's %d frames or repeated", f, i, frames)
		}
		seen[f] = true
	}
	return nil
}
