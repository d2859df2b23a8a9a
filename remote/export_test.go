package remote

import (
	"context"
	"os"
)

// CompressLayer compresses what export writes into a temp file in tmpDir,
// as PushLayer does before the upload: seekable frames when framed, else
// one stream of t's compression (as zstd layers were before seekable
// blobs). Benchmarks compare the two.
func (t *Target) CompressLayer(tmpDir string, export Export, framed bool) (Blob, error) {
	f, err := os.CreateTemp(tmpDir, "bench-*.blob")
	if err != nil {
		return Blob{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	blob, _, err := t.compressTo(f, export, framed)
	return blob, err
}

// PushStream pushes a layer as one compressed stream, without an index.
func (t *Target) PushStream(ctx context.Context, tmpDir string, export Export) (Blob, error) {
	return t.pushLayer(ctx, tmpDir, export, false)
}
