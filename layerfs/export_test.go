package layerfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
	"testing"
)

// registry stands in for an OCI registry: blobs by digest. Its Fetch
// verifies the digest as the real client does, failing the read at EOF.
type registry map[string][]byte

func (r registry) put(data []byte) string {
	sum := sha256.Sum256(data)
	d := "sha256:" + hex.EncodeToString(sum[:])
	r[d] = data
	return d
}

func (r registry) fetch(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
	digest := l.Digest
	data, ok := r[digest]
	if !ok {
		return nil, fmt.Errorf("blob %s: not found in the registry", digest)
	}
	return &verifyingReader{r: bytes.NewReader(data), h: sha256.New(), want: digest}, nil
}

type verifyingReader struct {
	r    io.Reader
	h    hash.Hash
	want string
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	if err == io.EOF {
		if got := "sha256:" + hex.EncodeToString(v.h.Sum(nil)); got != v.want {
			return n, fmt.Errorf("digest mismatch: got %s, want %s", got, v.want)
		}
	}
	return n, err
}

func (v *verifyingReader) Close() error { return nil }

// publish exports every unpublished layer of cache, records its digest
// and returns the cache's chain, as a node agent's push would.
func publish(t testing.TB, s *Store, reg registry, cache string) Chain {
	t.Helper()
	return publishBy(t, s, cache, func(ref CacheRef, layerID string) string {
		var buf bytes.Buffer
		must(t, s.ExportLayer(context.Background(), ref, layerID, &buf))
		return reg.put(buf.Bytes())
	})
}

// publishBy publishes cache's layers that have no digest yet with put,
// which stores a layer's image and returns its digest, and returns the
// cache's chain.
func publishBy(t testing.TB, s *Store, cache string, put func(ref CacheRef, layerID string) string) Chain {
	t.Helper()
	ctx := context.Background()
	ref := mustRef(t, cache)
	info, err := s.Inspect(ctx, ref)
	must(t, err)
	chain := Chain{Generation: info.Generation}
	for _, l := range info.Layers {
		d := l.Digest
		if d == "" {
			d = put(ref, l.ID)
			must(t, s.SetLayerDigest(ctx, ref, l.ID, d))
		}
		chain.Layers = append(chain.Layers, ChainLayer{Digest: d, Format: FormatEROFS})
	}
	return chain
}

func headIDs(t testing.TB, s *Store, cache string) []string {
	t.Helper()
	h, err := s.readHead(mustRef(t, cache))
	must(t, err)
	return h.layerIDs()
}

func TestExportAndSetDigestRefuseLayersNotInHead(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	buildChain(t, s, "ns/c", layerSteps)
	ids := headIDs(t, s, "ns/c")
	ref := mustRef(t, "ns/c")
	_, err := s.Squash(ctx, ref, 1)
	must(t, err)
	d := (registry{}).put([]byte("x"))
	for name, err := range map[string]error{
		"export squashed":  s.ExportLayer(ctx, ref, ids[0], io.Discard),
		"digest squashed":  s.SetLayerDigest(ctx, ref, ids[0], d),
		"export no cache":  s.ExportLayer(ctx, mustRef(t, "ns/none"), ids[0], io.Discard),
		"digest no cache":  s.SetLayerDigest(ctx, mustRef(t, "ns/none"), ids[0], d),
		"digest malformed": s.SetLayerDigest(ctx, ref, headIDs(t, s, "ns/c")[0], "sha256:xyz"),
	} {
		want := !strings.Contains(name, "malformed")
		if errors.Is(err, ErrNotFound) != want || err == nil {
			t.Errorf("%s: err = %v, want ErrNotFound: %v", name, err, want)
		}
	}
}
