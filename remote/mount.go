package remote

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// How MountBlob put a blob into the repository.
const (
	// Mounted: the registry linked the source repository's blob into the
	// target (cross-repository blob mount, 201 Created); no byte moved.
	Mounted = "mount"
	// Copied: the registry would not mount (it opened an upload session
	// instead, 202 Accepted, or the repositories are on different
	// registries), so the blob was read from the source, verified
	// against its digest, and uploaded.
	Copied = "copy"
)

// MountBlob puts blob b of repository from into t's repository without
// exporting its layer again: first by the OCI distribution spec's
// cross-repository mount (POST /v2/<repo>/blobs/uploads/?mount=<digest>
// &from=<repo>, with t's credentials, which must let it read from), and
// if the registry refuses that, by copying the blob from from (with
// from's credentials). It returns Mounted or Copied.
//
// go-containerregistry's WriteLayer of a MountableLayer does both steps
// too, but does not tell which happened; the caller reports mounts and
// copies apart, and a registry that never mounts is worth noticing.
//
// A blob with an index (Blob.Index) brings its index blob along the same
// way: without it, the layer in t's repository could be read whole only,
// and a node could not mount it before its bytes are there.
func (t *Target) MountBlob(ctx context.Context, from *Target, b Blob) (string, error) {
	how, err := t.mountOrCopy(ctx, from, b)
	if err != nil || b.Index == (v1.Hash{}) {
		return how, err
	}
	if _, err := t.mountOrCopy(ctx, from, b.IndexBlob()); err != nil {
		return "", fmt.Errorf("put the index of layer %s into %s: %w", b.Digest, t.Repository, err)
	}
	return how, nil
}

func (t *Target) mountOrCopy(ctx context.Context, from *Target, b Blob) (string, error) {
	if from.Repository.RegistryStr() == t.Repository.RegistryStr() {
		mounted, err := t.mount(ctx, from, b.Digest)
		if err != nil {
			return "", err
		}
		if mounted {
			return Mounted, nil
		}
	}
	if err := t.copyBlob(ctx, from, b); err != nil {
		return "", err
	}
	return Copied, nil
}

// mount asks the registry to mount the blob. A refusal is not an error:
// false, and the caller copies. Only a failure to reach the registry is.
func (t *Target) mount(ctx context.Context, from *Target, digest v1.Hash) (bool, error) {
	scopes := []string{t.Repository.Scope(transport.PushScope), from.Repository.Scope(transport.PullScope)}
	rt, err := transport.NewWithContext(ctx, t.Repository.Registry, t.auth, t.transport, scopes)
	if err != nil {
		return false, fmt.Errorf("authenticate to %s to mount blob %s from %s: %w", t.Repository.RegistryStr(), digest, from.Repository, err)
	}
	client := &http.Client{Transport: rt}
	u := url.URL{
		Scheme:   t.Repository.Scheme(),
		Host:     t.Repository.RegistryStr(),
		Path:     fmt.Sprintf("/v2/%s/blobs/uploads/", t.Repository.RepositoryStr()),
		RawQuery: url.Values{"mount": {digest.String()}, "from": {from.Repository.RepositoryStr()}}.Encode(),
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("mount blob %s from %s into %s: %w", digest, from.Repository, t.Repository, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusCreated {
		return true, nil
	}
	if resp.StatusCode == http.StatusAccepted {
		t.cancelUpload(ctx, client, resp)
	}
	return false, nil
}

// cancelUpload ends the upload session a refused mount opened, best
// effort: registries expire idle sessions anyway.
func (t *Target) cancelUpload(ctx context.Context, client *http.Client, resp *http.Response) {
	loc, err := resp.Location()
	if err != nil {
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, loc.String(), nil)
	if err != nil {
		return
	}
	if r, err := client.Do(req); err == nil {
		r.Body.Close()
	}
}

// copyBlob streams the blob from from to t. The registry checks the
// upload against its digest, and the download is verified as it is
// read, so neither side can swap its bytes.
func (t *Target) copyBlob(ctx context.Context, from *Target, b Blob) error {
	layer, err := partial.CompressedToLayer(&sourceBlob{ctx: ctx, from: from, blob: b})
	if err != nil {
		return err
	}
	if err := ggcr.WriteLayer(t.Repository, layer, t.options(ggcr.WithContext(ctx))...); err != nil {
		return fmt.Errorf("copy blob %s (%d bytes) from %s to %s: %w", b.Digest, b.Size, from.Repository, t.Repository, err)
	}
	return nil
}

// sourceBlob is a blob of another repository (partial.CompressedLayer).
type sourceBlob struct {
	ctx  context.Context
	from *Target
	blob Blob
}

func (s *sourceBlob) Digest() (v1.Hash, error)            { return s.blob.Digest, nil }
func (s *sourceBlob) Size() (int64, error)                { return s.blob.Size, nil }
func (s *sourceBlob) MediaType() (types.MediaType, error) { return s.blob.MediaType, nil }
func (s *sourceBlob) DiffID() (v1.Hash, error)            { return s.blob.DiffID, nil }
func (s *sourceBlob) Compressed() (io.ReadCloser, error) {
	rc, err := s.from.FetchCompressed(s.ctx, s.blob.Digest.String())
	if err != nil {
		return nil, err
	}
	if s.blob.Size > 0 {
		rc = &boundedReader{rc: rc, left: s.blob.Size, size: s.blob.Size, digest: s.blob.Digest.String()}
	}
	return rc, nil
}
