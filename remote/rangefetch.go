package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/klauspost/compress/zstd"
)

// OpenIndex fetches and checks the index blob indexDigest (Blob.Index, as
// the chain records it). It reads at most maxBytes (the size the chain
// states), verifies the digest, and refuses an index whose frames do not
// cover the image in order (Index.validate).
func (t *Target) OpenIndex(ctx context.Context, indexDigest string, maxBytes int64) (*Index, error) {
	if maxBytes <= 0 {
		return nil, fmt.Errorf("open layer index %s: its size bound is %d; pass the index size the chain records (Blob.IndexSize)", indexDigest, maxBytes)
	}
	data, err := t.readBlob(ctx, indexDigest, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("read layer index %s from %s: %w", indexDigest, t.Repository, err)
	}
	return parseIndex(indexDigest, data)
}

func parseIndex(digest string, data []byte) (*Index, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var idx Index
	if err := dec.Decode(&idx); err != nil {
		return nil, fmt.Errorf("layer index %s is not valid JSON of %s: %w", digest, MediaTypeIndex, err)
	}
	if err := idx.validate(); err != nil {
		return nil, fmt.Errorf("layer index %s is refused: %w", digest, err)
	}
	return &idx, nil
}

// RangeFetch returns a function that reads the image bytes [off, off+n)
// of seekable layer layerDigest, mapped by idx (from OpenIndex): one HTTP
// range request for the compressed frames that cover them, each frame
// decompressed and checked against idx before any of its bytes is
// returned. It is the lazy local copy's Fetch (layerfs/lazy).
func (t *Target) RangeFetch(layerDigest string, idx *Index) func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
	r := &ranger{t: t, layer: layerDigest, idx: idx}
	return r.fetch
}

// ranger reads one layer by range. Its client and decoder are made on the
// first read and kept: a new client would authenticate again (a ping and
// a token) on every read.
type ranger struct {
	t     *Target
	layer string
	idx   *Index

	mu     sync.Mutex
	client *http.Client
	dec    *zstd.Decoder
}

func (r *ranger) fetch(ctx context.Context, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n < 0 || n > r.idx.ImageBytes-off {
		return nil, fmt.Errorf("range [%d, +%d) of layer %s is outside its %d-byte image", off, n, r.layer, r.idx.ImageBytes)
	}
	if n == 0 {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	client, dec, err := r.setup(ctx)
	if err != nil {
		return nil, err
	}
	first, last := int(off/r.idx.FrameBytes), int((off+n-1)/r.idx.FrameBytes)
	from, to := r.idx.Frames[first].Offset, r.idx.Frames[last].Offset+r.idx.Frames[last].Size
	body, err := r.get(ctx, client, from, to)
	if err != nil {
		return nil, err
	}
	frameStart, _ := r.idx.frameRange(first)
	return &rangeReader{r: r, dec: dec, body: body, next: first, skip: off - frameStart, left: n}, nil
}

func (r *ranger) setup(ctx context.Context) (*http.Client, *zstd.Decoder, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client != nil {
		return r.client, r.dec, nil
	}
	if _, err := v1.NewHash(r.layer); err != nil {
		return nil, nil, fmt.Errorf("layer digest %q is not valid (want sha256:<64 hex>): %w", r.layer, err)
	}
	scopes := []string{r.t.Repository.Scope(transport.PullScope)}
	rt, err := transport.NewWithContext(ctx, r.t.Repository.Registry, r.t.auth, r.t.transport, scopes)
	if err != nil {
		return nil, nil, fmt.Errorf("authenticate to %s to read layer %s by range: %w", r.t.Repository.RegistryStr(), r.layer, err)
	}
	// A frame decodes to at most FrameBytes: a frame that claims more is
	// refused before it takes the memory.
	dec, err := zstd.NewReader(nil, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderMaxMemory(uint64(r.idx.FrameBytes)))
	if err != nil {
		return nil, nil, err
	}
	r.client, r.dec = &http.Client{Transport: rt}, dec
	return r.client, r.dec, nil
}

// get opens the blob's bytes [from, to). A registry that ignores Range
// answers 200 with the whole blob: its first bytes are skipped, and the
// reader stops after the range.
func (r *ranger) get(ctx context.Context, client *http.Client, from, to int64) (io.ReadCloser, error) {
	u := url.URL{
		Scheme: r.t.Repository.Scheme(),
		Host:   r.t.Repository.RegistryStr(),
		Path:   fmt.Sprintf("/v2/%s/blobs/%s", r.t.Repository.RepositoryStr(), r.layer),
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", from, to-1))
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch bytes %d-%d of layer %s from %s: %w", from, to-1, r.layer, r.t.Repository, err)
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
		if err := checkContentRange(resp.Header.Get("Content-Range"), from, to); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("fetch bytes %d-%d of layer %s from %s: %w", from, to-1, r.layer, r.t.Repository, err)
		}
		return resp.Body, nil
	case http.StatusOK:
		if _, err := io.CopyN(io.Discard, resp.Body, from); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("skip to byte %d of layer %s from %s (the registry ignored the range and sent the whole blob): %w", from, r.layer, r.t.Repository, err)
		}
		return resp.Body, nil
	}
	defer resp.Body.Close()
	return nil, fmt.Errorf("fetch bytes %d-%d of layer %s from %s: %w", from, to-1, r.layer, r.t.Repository,
		transport.CheckError(resp, http.StatusPartialContent))
}

// checkContentRange refuses a partial answer that is not the range asked
// for: frames would be read from the wrong place.
func checkContentRange(header string, from, to int64) error {
	var start, end int64
	if _, err := fmt.Sscanf(header, "bytes %d-%d/", &start, &end); err != nil {
		return fmt.Errorf("the registry answered 206 with Content-Range %q, which does not parse (want bytes %d-%d/<size>)", header, from, to-1)
	}
	if start != from || end != to-1 {
		return fmt.Errorf("the registry answered bytes %d-%d for bytes %d-%d", start, end, from, to-1)
	}
	return nil
}

// rangeReader returns a range's image bytes, frame by frame as it reads
// their compressed bytes, so that a long range holds one frame at a time.
type rangeReader struct {
	r    *ranger
	dec  *zstd.Decoder
	body io.ReadCloser
	next int   // the next frame to read
	skip int64 // bytes of the next frame before the range
	left int64 // bytes of the range not returned yet

	compressed, frame []byte
	out               []byte // verified bytes not returned yet
	// err is the first failure: the body is then at no frame's start, so
	// every later read fails with it too.
	err error
}

func (rr *rangeReader) Read(p []byte) (int, error) {
	for len(rr.out) == 0 {
		if rr.left == 0 {
			return 0, io.EOF
		}
		if rr.err != nil {
			return 0, rr.err
		}
		rr.err = rr.load()
	}
	n := copy(p, rr.out)
	rr.out = rr.out[n:]
	rr.left -= int64(n)
	return n, nil
}

// load reads, decompresses and verifies the next frame.
func (rr *rangeReader) load() error {
	i, f := rr.next, rr.r.idx.Frames[rr.next]
	if int64(cap(rr.compressed)) < f.Size {
		rr.compressed = make([]byte, f.Size)
	}
	rr.compressed = rr.compressed[:f.Size]
	if _, err := io.ReadFull(rr.body, rr.compressed); err != nil {
		return fmt.Errorf("read frame %d (blob bytes %d-%d) of layer %s from %s: %w", i, f.Offset, f.Offset+f.Size-1, rr.r.layer, rr.r.t.Repository, err)
	}
	frame, err := rr.dec.DecodeAll(rr.compressed, rr.frame[:0])
	if err := rr.verify(i, frame, err); err != nil {
		return err
	}
	rr.frame = frame
	rr.out = frame[rr.skip:min(int64(len(frame)), rr.skip+rr.left)]
	rr.next, rr.skip = i+1, 0
	return nil
}

func (rr *rangeReader) verify(i int, frame []byte, decodeErr error) error {
	start, end := rr.r.idx.frameRange(i)
	f := rr.r.idx.Frames[i]
	corrupt := func(what string, args ...any) error {
		return fmt.Errorf("layer %s frame %d (image bytes %d-%d, blob bytes %d-%d): %s: %w",
			rr.r.layer, i, start, end-1, f.Offset, f.Offset+f.Size-1, fmt.Sprintf(what, args...), ErrCorrupt)
	}
	if decodeErr != nil {
		return corrupt("does not decompress (%v)", decodeErr)
	}
	if int64(len(frame)) != end-start {
		return corrupt("decompresses to %d bytes, want %d", len(frame), end-start)
	}
	sum := sha256.Sum256(frame)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != f.Digest {
		return corrupt("its bytes hash to %s, the index says %s", got, f.Digest)
	}
	return nil
}

func (rr *rangeReader) Close() error { return rr.body.Close() }
