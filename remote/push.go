package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Blob is a layer as the registry holds it.
type Blob struct {
	Digest    v1.Hash // of the compressed blob
	DiffID    v1.Hash // of the uncompressed image
	Size      int64   // of the compressed blob
	MediaType types.MediaType
	// ImageBytes is the uncompressed image's size, for throughput reports.
	ImageBytes int64
	// Index is the digest of the layer's index blob (MediaTypeIndex) and
	// IndexSize its size, for reads by range (OpenIndex, RangeFetch);
	// zero for a gzip layer, which is read whole only.
	Index     v1.Hash
	IndexSize int64
}

// Export writes a layer's uncompressed EROFS image to w.
type Export func(w io.Writer) error

// PushLayer compresses what export writes into a temp file in tmpDir,
// hashing both streams on the way, then uploads the blob unless the
// repository has it already (a retried push of the same layer: exports are
// deterministic, so the digest is the same). A zstd layer is a seekable
// blob (seekable.go), and its index is pushed too, after the blob it maps.
func (t *Target) PushLayer(ctx context.Context, tmpDir string, export Export) (Blob, error) {
	return t.pushLayer(ctx, tmpDir, export, t.Compression == Zstd)
}

func (t *Target) pushLayer(ctx context.Context, tmpDir string, export Export, framed bool) (Blob, error) {
	f, err := os.CreateTemp(tmpDir, "new-push-*.blob")
	if err != nil {
		return Blob{}, fmt.Errorf("create temp file for a layer blob: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	blob, idx, err := t.compressTo(f, export, framed)
	if err != nil {
		return Blob{}, err
	}
	layer, err := partial.CompressedToLayer(&fileBlob{path: f.Name(), blob: blob})
	if err != nil {
		return Blob{}, err
	}
	if err := ggcr.WriteLayer(t.Repository, layer, t.options(ggcr.WithContext(ctx))...); err != nil {
		return Blob{}, fmt.Errorf("push layer %s (%d bytes) to %s: %w", blob.Digest, blob.Size, t.Repository, err)
	}
	if idx != nil {
		if blob.Index, blob.IndexSize, err = t.pushIndex(ctx, blob, idx); err != nil {
			return Blob{}, err
		}
	}
	return blob, nil
}

// pushIndex uploads idx as a blob of its own and returns its digest and size.
func (t *Target) pushIndex(ctx context.Context, blob Blob, idx *Index) (v1.Hash, int64, error) {
	data, err := json.Marshal(idx)
	if err != nil {
		return v1.Hash{}, 0, err
	}
	layer := static.NewLayer(data, MediaTypeIndex)
	if err := ggcr.WriteLayer(t.Repository, layer, t.options(ggcr.WithContext(ctx))...); err != nil {
		return v1.Hash{}, 0, fmt.Errorf("push the index of layer %s (%d bytes) to %s: %w", blob.Digest, len(data), t.Repository, err)
	}
	digest, err := layer.Digest()
	return digest, int64(len(data)), err
}

// layerWriter compresses a layer: one stream (gzip, or zstd where a
// benchmark compares), or seekable frames with an index.
func (t *Target) layerWriter(w io.Writer, framed bool) (io.WriteCloser, error) {
	if framed {
		return newSeekableWriter(w)
	}
	return t.Compression.writer(w)
}

func (t *Target) compressTo(f *os.File, export Export, framed bool) (Blob, *Index, error) {
	compressed := newCounter(sha256.New())
	zw, err := t.layerWriter(io.MultiWriter(f, compressed), framed)
	if err != nil {
		return Blob{}, nil, fmt.Errorf("start %s compression: %w", t.Compression, err)
	}
	uncompressed := newCounter(sha256.New())
	pw := newPipeWriter(io.MultiWriter(zw, uncompressed), 1<<20, 4)
	if err := export(pw); err != nil {
		zw.Close()
		return Blob{}, nil, fmt.Errorf("export layer: %w", errors.Join(pw.Close(), err))
	}
	if err := pw.Close(); err != nil {
		zw.Close()
		return Blob{}, nil, fmt.Errorf("compress layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return Blob{}, nil, fmt.Errorf("compress layer: %w", err)
	}
	var idx *Index
	if sw, ok := zw.(*seekableWriter); ok {
		idx = sw.Index()
	}
	return Blob{
		Digest:     v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", compressed.h.Sum(nil))},
		DiffID:     v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", uncompressed.h.Sum(nil))},
		Size:       compressed.n,
		ImageBytes: uncompressed.n,
		MediaType:  t.Compression.mediaType(),
	}, idx, nil
}

// counter hashes and counts what is written through it.
type counter struct {
	h hash.Hash
	n int64
}

func newCounter(h hash.Hash) *counter { return &counter{h: h} }

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

// fileBlob is a compressed layer in a temp file (partial.CompressedLayer).
type fileBlob struct {
	path string
	blob Blob
}

func (b *fileBlob) Digest() (v1.Hash, error)            { return b.blob.Digest, nil }
func (b *fileBlob) Size() (int64, error)                { return b.blob.Size, nil }
func (b *fileBlob) MediaType() (types.MediaType, error) { return b.blob.MediaType, nil }
func (b *fileBlob) DiffID() (v1.Hash, error)            { return b.blob.DiffID, nil }
func (b *fileBlob) Compressed() (io.ReadCloser, error)  { return os.Open(b.path) }

// PushManifest tags "latest" with an OCI image manifest of the chain
// (base first), whose config lists the layers' diff IDs. The tag keeps the
// blobs alive through registry garbage collection and lets crane or skopeo
// inspect a cache; the order that counts is the Cache resource's. It
// returns the manifest's digest.
//
// The layers' index blobs are listed too, after the whole chain: garbage
// collection keeps only blobs a tagged manifest references, and a layer
// whose index is gone can no longer be mounted before its bytes arrive.
// After the chain, so that the manifest's first layers are still the
// chain's, as an image tool reads them.
func (t *Target) PushManifest(ctx context.Context, chainBaseFirst []Blob) (v1.Hash, error) {
	listed := withIndexes(chainBaseFirst)
	config, err := imageConfig(listed)
	if err != nil {
		return v1.Hash{}, err
	}
	opts := t.options(ggcr.WithContext(ctx))
	configLayer := static.NewLayer(config, types.OCIConfigJSON)
	if err := ggcr.WriteLayer(t.Repository, configLayer, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("push image config to %s: %w", t.Repository, err)
	}
	manifest, err := imageManifest(configLayer, listed)
	if err != nil {
		return v1.Hash{}, err
	}
	digest, _, err := v1.SHA256(bytes.NewReader(manifest))
	if err != nil {
		return v1.Hash{}, err
	}
	if err := ggcr.Put(t.Repository.Tag("latest"), manifest, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("push manifest to %s: %w", t.Repository.Tag("latest"), err)
	}
	return digest, nil
}

// withIndexes is the chain followed by the index blobs of its layers.
func withIndexes(chain []Blob) []Blob {
	out := slices.Clone(chain)
	for _, b := range chain {
		if b.Index != (v1.Hash{}) {
			out = append(out, b.IndexBlob())
		}
	}
	return out
}

func imageConfig(chain []Blob) ([]byte, error) {
	cfg := v1.ConfigFile{OS: "linux", Architecture: "amd64", RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{}}}
	for _, b := range chain {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, b.DiffID)
	}
	return json.Marshal(cfg)
}

func imageManifest(config v1.Layer, chain []Blob) (rawManifest, error) {
	digest, err1 := config.Digest()
	size, err2 := config.Size()
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        v1.Descriptor{MediaType: types.OCIConfigJSON, Digest: digest, Size: size},
		Layers:        []v1.Descriptor{},
	}
	for _, b := range chain {
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: b.MediaType, Digest: b.Digest, Size: b.Size})
	}
	return json.Marshal(m)
}

// rawManifest is a manifest ready to put (remote.Taggable).
type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// BlobOf is the Blob a chain records, with its index blob (index and
// indexSize; "" and 0 for a layer without one); digests that do not parse
// make an empty hash, which the registry then refuses in the manifest.
func BlobOf(digest, diffID, mediaType string, size int64, index string, indexSize int64) Blob {
	d, _ := v1.NewHash(digest)
	id, _ := v1.NewHash(diffID)
	b := Blob{Digest: d, DiffID: id, MediaType: types.MediaType(mediaType), Size: size}
	if index != "" {
		b.Index, _ = v1.NewHash(index)
		b.IndexSize = indexSize
	}
	return b
}

// IndexBlob is b's index as a blob of its own. The index is stored
// uncompressed, so its diff ID is its digest.
func (b Blob) IndexBlob() Blob {
	return Blob{Digest: b.Index, DiffID: b.Index, Size: b.IndexSize, MediaType: MediaTypeIndex, ImageBytes: b.IndexSize}
}
