package layerfs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Seeding: a cache with no generation on this node may start from a
// fallback's layers (MountOptions.Fallbacks), the restore-keys rule of CI
// caches. Layers are immutable once a head names them, so the volume
// mounts the fallback's layer directories as they are, and its commit
// creates the cache with its own layer on top of the same ids: nothing is
// copied. Sharing needs no reference counts: a layer exists iff a head or
// a volume record names it (referencedLayers), so a layer both heads name
// outlives the removal or squash of either, and the seeded volume's record
// (Layers and SeedLayers) keeps the seed alive until its commit's head
// names it. The record, with the seed, is written atomically before the
// volume mounts (overlayLayout.create), as every record is.

// MaxFallbacks is how many fallbacks a volume may name.
const MaxFallbacks = 5

// fallbackLockWait bounds the wait for a fallback's lock. A mount holds its
// own cache's lock while it reads a fallback's head, so two mounts whose
// caches fall back to each other could otherwise wait on each other for
// ever; past the bound the unlocked read stands (heads are replaced whole
// by rename, so it is one whole generation).
const fallbackLockWait = 2 * time.Second

// Seed is what a volume or cache started from: a fallback cache at one of
// its generations.
type Seed struct {
	Cache      CacheRef `json:"cache"`
	Generation int64    `json:"generation"`
}

// String is NAMESPACE/NAME@GENERATION.
func (s Seed) String() string { return fmt.Sprintf("%s@%d", s.Cache, s.Generation) }

// hasGeneration tells whether h holds a commit. Mount records an empty
// head (generation 0) for a new cache, which counts as none.
func hasGeneration(h *head) bool {
	return h != nil && (h.Generation > 0 || len(h.Layers) > 0)
}

// validateFallbacks checks the fallbacks as Validate does.
func (o MountOptions) validateFallbacks() error {
	if len(o.Fallbacks) == 0 {
		return nil
	}
	if len(o.Fallbacks) > MaxFallbacks {
		return fmt.Errorf("volume of cache %s names %d fallbacks: use at most %d", o.Cache, len(o.Fallbacks), MaxFallbacks)
	}
	for _, f := range o.Fallbacks {
		if err := f.Validate(); err != nil {
			return fmt.Errorf("fallback %q: %w", f, err)
		}
	}
	return nil
}

// seedFor is the seed of a new volume of t's cache: the first fallback
// with a generation, and its layers. nil when the cache has a generation
// or no fallback has one.
func (s *Store) seedFor(t *txn, opts MountOptions) (*Seed, []LayerInfo, error) {
	if hasGeneration(t.Head) {
		return nil, nil, nil // the restore-keys rule: an existing cache ignores its fallbacks
	}
	for _, f := range opts.Fallbacks {
		if f == opts.Cache {
			continue // a class's fallback template may name the cache itself
		}
		h, err := s.fallbackHead(t.ctx, f)
		if err != nil {
			return nil, nil, fmt.Errorf("read fallback %s of cache %s: %w", f, opts.Cache, err)
		}
		if !hasGeneration(h) {
			continue
		}
		// A cache starts from its fallback's data as it is kept: overlay
		// layers, or a generation to snapshot.
		if h.Layout.orDefault() != opts.Layout.orDefault() {
			return nil, nil, fmt.Errorf("fallback %s of cache %s has the %s layout, and a cache of the %s layout cannot start from it: remove it from the fallbacks: %w",
				f, opts.Cache, h.Layout.orDefault(), opts.Layout.orDefault(), ErrLayoutMismatch)
		}
		return &Seed{Cache: f, Generation: h.Generation}, seedLayers(h.Layers, opts.FallbackRepositories[f]), nil
	}
	return nil, nil, nil
}

// seedLayers are a fallback's layers as the seeded cache holds them:
// unpublished, since their digests name blobs of the fallback's registry
// repository (repo), not the seeded cache's. A digest stays, with
// MountFrom repo, when repo is known, so the seeded cache's first publish
// can mount the blob rather than upload it again; a layer the fallback
// itself holds with MountFrom (seeded and not yet published) keeps its
// own. Covers go: the runs they name are the fallback's.
func seedLayers(layers []LayerInfo, repo string) []LayerInfo {
	out := slices.Clone(layers)
	for i := range out {
		out[i].Covers = nil
		switch {
		case out[i].MountFrom != "":
		case repo != "" && out[i].Digest != "":
			out[i].MountFrom = repo
		default:
			out[i].Digest = ""
		}
	}
	return out
}

// fallbackHead reads a fallback's head, holding its lock only for the
// read; nil if it does not exist. A fallback without a generation is
// skipped on an unlocked read, which also keeps two new caches that fall
// back to each other from taking each other's lock.
func (s *Store) fallbackHead(ctx context.Context, f CacheRef) (*head, error) {
	peek, err := s.readHead(f)
	if errors.Is(err, ErrNotFound) || (err == nil && !hasGeneration(peek)) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	wait, cancel := context.WithTimeout(ctx, fallbackLockWait)
	defer cancel()
	l, err := s.lockCache(wait, f)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return peek, nil // see fallbackLockWait
	}
	h, err := s.readHead(f)
	unlockUnless(l, ondisk.Exists(s.headPath(f)))
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	return h, err
}

// seedVolume makes r a volume seeded from seed: its lower layers are the
// seed's. The cache's head is not touched, so a volume that is discarded
// or never commits creates nothing. r takes the UID of the empty head a
// plain mount made, if any, so that GC and RemoveIfUnused see it use that
// cache (cacheInUse); none otherwise.
func (t *txn) seedVolume(r *volumeRecord, seed *Seed, layers []LayerInfo) {
	r.SeededFrom, r.SeedLayers = seed, layers
	r.BaseGeneration = 0
	r.Layers = make([]string, len(layers))
	for i, l := range layers {
		r.Layers[i] = l.ID
	}
	if t.Head != nil {
		r.CacheUID = t.Head.UID
	}
}

// landSeeded prepares the head a seeded volume's layer lands on. If the
// cache still has no generation, the head (the empty one a plain mount
// made, or a new incarnation with a new UID, so that a plain volume of an
// empty head removed meanwhile stays dropped) starts as the seed's layers
// and remembers the seed. If another build created the cache meanwhile,
// the layer lands on the current head as any concurrent writer's does
// (per-file last writer wins), not on the seed: a head's history is never
// rewritten. A removal of the cache meanwhile drops nothing: it removed
// nothing this volume saw. seeded tells whether the head was seeded.
func (t *txn) landSeeded(r *volumeRecord) (seeded bool) {
	if hasGeneration(t.Head) {
		return false
	}
	if t.Head == nil {
		now := time.Now().UTC()
		t.Head = &head{Cache: r.Cache, UID: randomID(), Created: now, LastUsed: now}
	}
	t.Head.Layers = slices.Clone(r.SeedLayers)
	t.Head.SeededFrom = r.SeededFrom
	return true
}

// seedNames tells whether the head of the seed's cache still names id
// (for sweepIfOrphaned: a discarded seeded volume's layers are the
// fallback's, not its own cache's).
func (s *Store) seedNames(r *volumeRecord, id string) bool {
	if r.SeededFrom == nil {
		return false
	}
	h, err := s.readHead(r.SeededFrom.Cache)
	return err == nil && h.hasLayer(id)
}
