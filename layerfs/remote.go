package layerfs

import (
	"context"
	"fmt"
	"io"

	"github.com/opencontainers/go-digest"
)

// Chain is a cache's cluster-wide layer chain, as the Cache resource's
// generation log states it.
type Chain struct {
	Generation int64
	Layers     []ChainLayer // newest first
}

// ChainLayer is one published layer of a Chain.
type ChainLayer struct {
	Digest string
	Size   int64 // compressed blob size, for progress; 0 if unknown
	// Covers lists, newest first, the digests of the layers this one
	// replaced in the chain when a node published its squash of them. A
	// node that still has those layers (or its own squash of them) uses
	// them and fetches nothing.
	Covers []string
}

// Fetch opens layer digest's uncompressed OCI tar stream; the reader
// verifies the digest, so a read error (including a mismatch) fails the
// import.
type Fetch func(ctx context.Context, digest string) (io.ReadCloser, error)

// SyncOptions tune a Sync.
type SyncOptions struct {
	Parallel int // layers fetched at once; 0 means 4
}

// SyncResult tells what a Sync did.
type SyncResult struct {
	Changed      bool  `json:"changed"`      // the head changed
	Fetched      int   `json:"fetched"`      // layers fetched
	FetchedBytes int64 `json:"fetchedBytes"` // bytes of the fetched layers on disk
	Generation   int64 `json:"generation"`   // the cache's generation after the sync
	Unpublished  int   `json:"unpublished"`  // local layers without a digest, kept on top
	// NeedsSquash is true when the head is now deeper than
	// Options.MaxLayers, as in CommitResult.
	NeedsSquash bool `json:"needsSquash,omitempty"`
}

// validateDigest refuses anything but a well-formed content digest: chain
// digests come from a shared resource and end up in heads and messages.
func validateDigest(what, d string) error {
	if _, err := digest.Parse(d); err != nil {
		return fmt.Errorf("%s %q is not a content digest like sha256:<64 hex digits>: %w", what, d, err)
	}
	return nil
}

// SetLayerDigest records that layer layerID of cache was published as
// digest (an atomic head rewrite under the cache lock). ErrNotFound if the
// layer is no longer in the head (squashed away): the caller drops it.
//
// Call it once the chain lists the digest (the Cache resource's update
// landed), not merely once the blob is pushed: Sync drops a layer with a
// digest that its chain lacks, and if the update then never lands, the
// commit would be gone from both the node and the chain. Until the call,
// a Sync with a chain that already has the digest keeps the layer as
// unpublished on top and fetches the blob again below it, so a node
// agent should not run both for one cache at once.
func (s *Store) SetLayerDigest(ctx context.Context, cache CacheRef, layerID, digest string) error {
	if err := cache.Validate(); err != nil {
		return err
	}
	if err := validateDigest("layer digest", digest); err != nil {
		return err
	}
	h, l, err := s.lockHead(ctx, cache)
	if err != nil {
		return err
	}
	defer l.unlock()
	if h == nil {
		return fmt.Errorf("record digest of layer %s: cache %s: %w", layerID, cache, ErrNotFound)
	}
	i := h.layerIndex(layerID)
	if i < 0 {
		return fmt.Errorf("record digest of layer %s: it is no longer in cache %s (squashed or synced away): %w", layerID, cache, ErrNotFound)
	}
	if h.Layers[i].Digest == digest {
		return nil
	}
	h.Layers[i].Digest = digest
	if err := s.writeHead(h); err != nil {
		return fmt.Errorf("record digest of layer %s of cache %s: %w", layerID, cache, err)
	}
	return nil
}
