package layerfs

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layercache/layercache/layerfs/lazy"
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
	// Size is the blob's size as the chain states it. Sync refuses a
	// layer whose Size exceeds SyncOptions.MaxLayerBytes before fetching
	// it; the Fetch must not read past it.
	Size int64
	// Format is how the blob's content is laid out once decompressed.
	Format LayerFormat
	// Covers lists, newest first, the digests of the layers this one
	// replaced in the chain when a node published its squash of them. A
	// node that still has those layers (or its own squash of them) uses
	// them and fetches nothing.
	Covers []string
	// DiffID is the digest of the uncompressed image. A layer mounted
	// before its bytes are here (SyncOptions.OpenLazy) counts as complete
	// only once its local copy matches it.
	DiffID string
	// Index and IndexSize name the layer's index blob, which lets the
	// image be read by range; "" for a layer that is fetched whole only.
	Index     string
	IndexSize int64
}

// Lazy reports whether the layer can be mounted before its bytes are
// here: its blob is read by range through its index.
func (l ChainLayer) Lazy() bool { return l.Index != "" && l.DiffID != "" }

// LayerFormat is the content of a published layer's blob.
type LayerFormat string

const (
	// FormatEROFS is a read-only EROFS image of the layer directory
	// (layerfs/erofs), which the receiving node mounts as the layer: no
	// per-file work on a pull, and nothing to translate.
	FormatEROFS LayerFormat = "erofs"
)

// Fetch opens a chain layer's decompressed blob. The reader verifies the
// digest, so a read error (including a mismatch) fails the import, and
// stops with an error past layer.Size compressed bytes.
type Fetch func(ctx context.Context, layer ChainLayer) (io.ReadCloser, error)

// SyncOptions tune a Sync.
type SyncOptions struct {
	Parallel int // layers fetched at once; 0 means 4
	// MaxLayerBytes bounds each fetched layer: its blob (ChainLayer.Size,
	// checked before the fetch), its decompressed bytes, and what it
	// takes on disk (checked while it is written). 0 means no bound. A
	// layer past it fails the Sync with ErrTooLarge and the head is
	// unchanged.
	MaxLayerBytes int64
	// OpenLazy, if set, opens a layer that can be read by range
	// (ChainLayer.Lazy): Sync mounts it at once over a local copy that
	// its reads fill on demand and a background fetch completes (see
	// lazymount.go). Nil fetches every layer whole before the head moves.
	OpenLazy OpenLazy
	// Layout is the layout of a cache the Sync creates ("" is overlay);
	// an existing cache keeps its own, and one of another layout fails
	// with ErrLayoutMismatch. A snapshot cache takes the chain's newest
	// layer only: each is a whole generation (snapshot_sync.go).
	Layout Layout
	// LazyWait is how long a read of a lazily mounted layer waits for
	// bytes the registry cannot give now before it fails with EIO; 0
	// means 30 s.
	LazyWait time.Duration
}

// LazySource reads one layer's image by range.
type LazySource struct {
	// ImageBytes is the uncompressed image's size.
	ImageBytes int64
	// ChunkBytes is the unit of each fetch (a power of two, as
	// lazy.Options.ChunkSize); 0 means 1 MiB.
	ChunkBytes int64
	// Fetch reads the image's bytes [off, off+n); it checks what it
	// returns (a corrupt range wraps lazy.ErrCorrupt).
	Fetch lazy.Fetch
	// Prefetch are the chunks the background completion fetches first:
	// those the first build on another fresh node read, in its order.
	Prefetch []int
	// RecordReads, if set and Prefetch is empty, is given the chunks the
	// reads of the layer touched, in order, once its copy is complete:
	// the prefetch list of the next fresh node.
	RecordReads func(ctx context.Context, chunks []int) error
}

// OpenLazy opens a chain layer's image for reads by range. The layer's
// size bounds (SyncOptions.MaxLayerBytes) are checked by the store, on
// LazySource.ImageBytes, before any of the image is read.
type OpenLazy func(ctx context.Context, cache CacheRef, layer ChainLayer) (LazySource, error)

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
	err := s.transact(ctx, scope{cache: cache}, func(t *txn) error {
		if t.Head == nil {
			return fmt.Errorf("cache %s: %w", cache, ErrNotFound)
		}
		i := t.Head.layerIndex(layerID)
		if i < 0 {
			return fmt.Errorf("it is no longer in cache %s (squashed or synced away): %w", cache, ErrNotFound)
		}
		t.Head.Layers[i].Digest, t.Head.Layers[i].MountFrom = digest, ""
		return nil
	})
	if err != nil {
		return fmt.Errorf("record digest of layer %s: %w", layerID, err)
	}
	return nil
}
