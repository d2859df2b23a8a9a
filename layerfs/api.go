package layerfs

import (
	"os"
	"time"

	"github.com/go-logr/logr"
)

// DefaultRoot is where a node keeps its layers, cache heads and volumes.
const DefaultRoot = "/var/lib/layercache"

// DefaultMaxLayers is the head depth above which a cache should be squashed.
const DefaultMaxLayers = 32

// Options configure a Store. The zero value of every field but Root is usable.
type Options struct {
	// Root is the store's directory; it must be on a filesystem that can host
	// overlay upper directories (ext4, xfs with d_type, tmpfs, btrfs).
	Root string
	// MaxLayers is the head depth above which NeedsSquash is reported.
	MaxLayers int
	// Progress, if set, receives progress of long operations (squash, gc).
	Progress func(Progress)
	// SnapshotImageBytes is the size of the sparse btrfs image file
	// (<root>/snapshot.img) made for snapshot caches when the root is not
	// on btrfs; 0 means DefaultSnapshotImageBytes. Sparse: it takes only
	// what the caches use, up to this size. Ignored once the image exists.
	SnapshotImageBytes int64
	// MkfsBtrfs is the mkfs.btrfs program that formats that image; ""
	// means "mkfs.btrfs" looked up on PATH. Only the image's creation
	// runs it; everything else is done with ioctls.
	MkfsBtrfs string
	// Log receives what the store does in the background (the completion
	// of layers mounted before their bytes were here); nil logs nothing.
	Log logr.Logger
	// OnLazyReadFailed, if set, is told of the first failed read of each
	// lazily mounted layer (cache, the layer's digest, why); the volumes
	// over it are discarded at their end (EndResult.FailedRead). It runs
	// on the read's goroutine and must not call the store.
	OnLazyReadFailed func(cache CacheRef, digest string, err error)
	// OnLazyComplete, if set, is told of each lazily mounted layer whose
	// copy was completed and settled (CacheInfo.Filling went down).
	OnLazyComplete func(cache CacheRef)
	// LazyfsSidecar has a sidecar (`layercache lazyfs`, LazyfsSidecar)
	// serve the store's lazyfs, so that the layers mounted before their
	// bytes were here outlive this process: their reads wait for the next
	// one. Without it, this process serves them, and they read errors
	// once it ended until the next one resumes them.
	LazyfsSidecar bool
}

// Progress reports how far a long operation has come.
type Progress struct {
	Op    string // "squash", "gc" or "pull"
	Cache string // NAMESPACE/NAME, if the operation is about one cache
	Done  int64  // entries (squash), items (gc) or layers (pull) handled so far
	Total int64  // 0 when unknown
}

// MountOptions describe the volume to create.
type MountOptions struct {
	// Cache the volume is a copy-on-write view of.
	Cache CacheRef
	// ReadOnly volumes are writable scratch views that can never be committed
	// (mode "read" in the design).
	ReadOnly bool
	// Root directory ownership and mode of the merged view; Mode 0 means 0777.
	UID, GID int
	Mode     os.FileMode
	// Writer names who uses the volume (a pod), recorded as the cache's last
	// writer on commit.
	Writer string
	// AllowSetuid and AllowDevices mount the volume without nosuid or
	// nodev, for the rare cache that must hold working set-id programs or
	// device nodes (a chroot, an image store for a privileged builder).
	// Off by default: builds are untrusted and run on the node's kernel.
	AllowSetuid, AllowDevices bool
	// LimitBytes bounds the volume's changes (its upper layer, in allocated
	// bytes); 0 means no bound. It is enforced at commit: a volume whose
	// changes are larger is discarded (CommitResult.OverLimit). The store
	// has no project quotas, so the build itself is not stopped. With
	// LayoutSnapshot it is a live limit (a btrfs qgroup on the volume's
	// exclusive bytes): a write past it fails with EDQUOT.
	LimitBytes int64
	// Layout of a new cache ("" means overlay). Mounting an existing
	// cache with another layout fails with ErrLayoutMismatch.
	Layout Layout
	// Fallbacks are caches to start from, tried in order, while Cache has
	// no generation on this node: the volume's lower layers are the first
	// fallback's layers at its current generation (shared, never copied),
	// and its commit creates Cache with its layer on top of exactly those
	// (seed.go). A snapshot cache's volume is instead a writable snapshot
	// of the fallback's generation (constant time), and its commit
	// creates Cache as its own generation; a fallback must have the
	// cache's layout. Once Cache has a generation they are ignored. A
	// fallback equal to Cache is skipped. At most MaxFallbacks.
	Fallbacks []CacheRef
	// FallbackRepositories names the registry repository of each
	// fallback whose layer digests are blobs there (a cache published
	// through a registry). A volume seeded from one keeps those digests
	// with it as LayerInfo.MountFrom; the layers of a fallback not named
	// lose their digests, which name no blob the cache can use.
	FallbackRepositories map[CacheRef]string
	// Labels are the caller's, kept with the volume from its creation
	// (as containerd keeps a snapshot's labels): who it belongs to, what
	// to do at its end. At most MaxLabelBytes in all.
	Labels map[string]string
}

// MaxLabelBytes bounds a volume's labels (keys and values), which every
// read of its record decodes.
const MaxLabelBytes = 4096

// Volume is a provisioned copy-on-write view of a cache.
type Volume struct {
	ID             string    `json:"id"`
	Cache          CacheRef  `json:"cache"`
	ReadOnly       bool      `json:"readOnly,omitempty"`
	Writer         string    `json:"writer,omitempty"`
	BaseGeneration int64     `json:"baseGeneration"`
	Layers         []string  `json:"layers"` // lower layers, newest first
	Created        time.Time `json:"created"`
	// MergedPath is where the view is mounted.
	MergedPath string `json:"mergedPath"`
	// Mounted tells whether the overlay is currently mounted at MergedPath.
	Mounted bool `json:"mounted"`
	// LimitBytes is MountOptions.LimitBytes.
	LimitBytes int64 `json:"limitBytes,omitempty"`
	// Torn is true when the node went down while the volume was mounted:
	// its upper layer was written without syncs (a volatile overlay) and
	// may be torn, so it was emptied at remount and the volume will never
	// be committed (Commit discards it and says so in CommitResult.Torn).
	// A snapshot volume mounted when the node went down is torn too (one
	// rule for both layouts): its build was cut short.
	Torn bool `json:"torn,omitempty"`
	// Layout of the volume's cache.
	Layout Layout `json:"layout,omitempty"`
	// SeededFrom is the fallback the volume started from, when its cache
	// had no generation; nil if it started from its own cache (or empty).
	SeededFrom *Seed `json:"seededFrom,omitempty"`
	// Labels are MountOptions.Labels of the mount that created the volume.
	Labels map[string]string `json:"labels,omitempty"`
}

// CommitResult tells what a Commit did.
type CommitResult struct {
	Cache      CacheRef `json:"cache"`
	Generation int64    `json:"generation"`
	Layer      string   `json:"layer,omitempty"` // empty when nothing changed
	Bytes      int64    `json:"bytes"`
	// NeedsSquash is true when the head is now deeper than Options.MaxLayers.
	NeedsSquash bool `json:"needsSquash,omitempty"`
	// Dropped is true when the cache was removed while the volume was in use,
	// so its changes were discarded as the removal asked.
	Dropped bool `json:"dropped,omitempty"`
	// Torn is true when the volume's upper layer may have been torn by a
	// crash (see Volume.Torn): the volume was discarded instead of
	// committed, and the cache is unchanged. Report it (an Event); the
	// build's results are lost.
	Torn bool `json:"torn,omitempty"`
	// OverLimit is true when the volume's changes (Bytes) were larger than
	// its LimitBytes: the volume was discarded instead of committed, and
	// the cache is unchanged.
	OverLimit bool `json:"overLimit,omitempty"`
	// SeededFrom is set when this commit created the cache on top of a
	// fallback's layers (see MountOptions.Fallbacks); nil otherwise.
	SeededFrom *Seed `json:"seededFrom,omitempty"`
}

// LayerInfo describes one committed layer.
type LayerInfo struct {
	ID      string    `json:"id"`
	Bytes   int64     `json:"bytes"`
	Files   int64     `json:"files"`
	Created time.Time `json:"created"`
	// Digest is the layer's blob digest in the cache's registry repository
	// ("sha256:<hex>"), set once the layer was published or pulled; empty
	// for a layer only this node has (unpublished).
	Digest string `json:"digest,omitempty"`
	// Covers lists the digests of the published layers a squash merged
	// into this one, newest first: the layer stands for that run of the
	// cluster-wide chain, so it is neither pushed again nor fetched again.
	Covers []string `json:"covers,omitempty"`
	// MountFrom is the registry repository Digest lives in when that is
	// not the cache's own: a layer seeded from a fallback's published
	// layer (MountOptions.FallbackRepositories) keeps the fallback's
	// blob, so that the cache's first publish can mount it into its own
	// repository instead of uploading it again. Such a layer is not
	// published to its cache until SetLayerDigest records its digest
	// there, which clears MountFrom.
	MountFrom string `json:"mountFrom,omitempty"`
}

// published tells whether the layer's content is in the cache's registry
// repository, as itself (Digest) or as the run of layers it merged
// (Covers).
func (l LayerInfo) published() bool {
	return (l.Digest != "" && l.MountFrom == "") || len(l.Covers) > 0
}

// CacheInfo is what List and Inspect report about one cache.
type CacheInfo struct {
	Cache      CacheRef    `json:"cache"`
	Generation int64       `json:"generation"`
	Layers     []LayerInfo `json:"layers"` // newest first
	// Bytes is the sum of the cache's layers, including layers it shares
	// with other caches (a seeded cache and its fallback): summing Bytes
	// over caches counts a shared layer more than once. GC counts it once.
	Bytes      int64     `json:"bytes"`
	LastUsed   time.Time `json:"lastUsed"`
	LastWriter string    `json:"lastWriter,omitempty"`
	Volumes    []string  `json:"volumes,omitempty"` // volumes using the cache
	// Layout of the cache; a snapshot cache reports its one generation
	// as its one layer.
	Layout Layout `json:"layout,omitempty"`
	// SeededFrom is the fallback the cache was created on top of, if any.
	SeededFrom *Seed `json:"seededFrom,omitempty"`
	// Filling counts the layers of the head that were mounted before
	// their bytes were here and whose copies are not complete yet.
	Filling int `json:"filling,omitempty"`
}

// SquashResult tells what a Squash did.
type SquashResult struct {
	Squashed  bool   `json:"squashed"` // false when the head was shallow enough
	Layer     string `json:"layer,omitempty"`
	OldLayers int    `json:"oldLayers"`
	Entries   int64  `json:"entries"`
}

// GCOptions bound the store; zero values disable a bound.
type GCOptions struct {
	MaxAge   time.Duration // remove caches unused for longer
	MaxBytes int64         // remove least recently used caches while larger
	// MinFreeBytes and MinFreePercent (of the filesystem's size) evict the
	// least recently used unused caches while the filesystem that holds the
	// store has less free space than that, whoever filled it.
	MinFreeBytes   int64
	MinFreePercent float64
}

// GCResult tells what a GC removed.
type GCResult struct {
	RemovedCaches []CacheRef `json:"removedCaches,omitempty"`
	RemovedLayers int        `json:"removedLayers"`
	FreedBytes    int64      `json:"freedBytes"`
}

// RecoverResult tells what Recover repaired.
type RecoverResult struct {
	Remounted     []string `json:"remounted,omitempty"`
	RemovedTemp   int      `json:"removedTemp"`
	RemovedLayers int      `json:"removedLayers"`
	// Torn lists the volumes found torn by a crash at remount (see
	// Volume.Torn): their upper layers were emptied.
	Torn []string `json:"torn,omitempty"`
	// Failed lists the volumes Recover could not repair (for example on a
	// full disk); it repaired everything else. Recover's error joins them.
	Failed []VolumeError `json:"failed,omitempty"`
	// Unswept is why some unreferenced layers or subvolumes could not be
	// deleted; the sweeps deleted every other one, and GC retries them.
	Unswept string `json:"unswept,omitempty"`
	// Finished tells that Recover went through every step: its error then
	// only joins Failed and Unswept, and the store serves.
	Finished bool `json:"-"`
}

// VolumeError is a volume an operation over many volumes could not handle.
type VolumeError struct {
	Volume string `json:"volume"`
	Err    error  `json:"-"`
	// Message is Err's text, for JSON.
	Message string `json:"error"`
}

func (e VolumeError) Error() string { return e.Message }
func (e VolumeError) Unwrap() error { return e.Err }
