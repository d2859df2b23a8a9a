package remote

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Deleted is what DeleteManifest found and did.
type Deleted struct {
	// Digest is the manifest "latest" named; zero if it named none.
	Digest v1.Hash
	// Deleted tells whether this call deleted it; false when the tag or
	// the manifest was gone already (another node deleted it first).
	Deleted bool
}

// DeleteManifest deletes the manifest that "latest" names. The
// distribution spec deletes manifests by digest (registries refuse a
// delete by tag or ignore it) and the tags that name the manifest go with
// it; the registry's garbage collection then frees the blobs that no
// other manifest names. A tag or manifest that is gone already counts as
// deleted, so agents racing to delete it all succeed.
func (t *Target) DeleteManifest(ctx context.Context) (Deleted, error) {
	desc, err := ggcr.Head(t.Repository.Tag("latest"), t.options(ggcr.WithContext(ctx))...)
	if isNotFound(err) {
		return Deleted{}, nil
	}
	if err != nil {
		return Deleted{}, fmt.Errorf("read the digest of %s: %w", t.Repository.Tag("latest"), err)
	}
	deleted, err := t.DeleteManifestDigest(ctx, desc.Digest)
	if err == nil {
		err = t.deletePrefetchLists(ctx)
	}
	return Deleted{Digest: desc.Digest, Deleted: deleted}, err
}

// deletePrefetchLists deletes the manifests of the layers' prefetch
// lists (prefetch-* tags), which garbage collection would otherwise keep
// with their blobs after the cache is gone.
func (t *Target) deletePrefetchLists(ctx context.Context) error {
	opts := t.options(ggcr.WithContext(ctx))
	tags, err := ggcr.List(t.Repository, opts...)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list the tags of %s: %w", t.Repository, err)
	}
	var errs []error
	for _, tag := range tags {
		if !strings.HasPrefix(tag, "prefetch-") {
			continue
		}
		desc, err := ggcr.Head(t.Repository.Tag(tag), opts...)
		if isNotFound(err) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read the digest of %s: %w", t.Repository.Tag(tag), err))
			continue
		}
		if _, err := t.DeleteManifestDigest(ctx, desc.Digest); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeleteManifestDigest deletes manifest digest of the repository; false
// without error if it was gone already.
func (t *Target) DeleteManifestDigest(ctx context.Context, digest v1.Hash) (bool, error) {
	err := ggcr.Delete(t.Repository.Digest(digest.String()), t.options(ggcr.WithContext(ctx))...)
	if isNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("delete manifest %s of %s: %w", digest, t.Repository, err)
	}
	return true, nil
}

// IsDeleteUnsupported tells whether the registry refuses to delete
// manifests at all (405, UNSUPPORTED: the distribution registry without
// storage.delete.enabled). No retry helps; the registry's setting must
// change.
func IsDeleteUnsupported(err error) bool {
	var terr *transport.Error
	if !errors.As(err, &terr) {
		return false
	}
	if terr.StatusCode == http.StatusMethodNotAllowed {
		return true
	}
	for _, d := range terr.Errors {
		if d.Code == transport.UnsupportedErrorCode {
			return true
		}
	}
	return false
}

func isNotFound(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}
