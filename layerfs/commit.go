package layerfs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Commit unmounts the volume and makes its upper directory, which already
// lives where layers live, the cache's newest layer: one atomic write of
// the head. A volume without changes adds no layer. If anything fails the
// volume stays (re)mounted with its upper directory, so the commit can be
// retried.
//
// An overlay volume is sealed (unmounted, its data synced, measured)
// under its own lock only; the cache's lock is taken after, for the head's
// write alone, so that the commits of one cache do not queue behind each
// other's syncs (issue 18).
func (s *Store) Commit(ctx context.Context, volumeID string) (res CommitResult, err error) {
	err = s.endVolume(ctx, commitScope(volumeID), func(t *txn) (e ending, err error) {
		r, err := s.liveVolume(t)
		if err == nil && r.ReadOnly {
			err = fmt.Errorf("volume %q is a read-only view of cache %s and cannot be committed; discard it", volumeID, r.Cache)
		}
		if err != nil {
			return e, err
		}
		res, e, err = s.commitIn(ctx, t)
		return e, err
	})
	return res, err
}

// commitScope is what a commit locks first: the store shared, as it
// creates a layer, and the volume; its cache only once it is sealed.
func commitScope(volumeID string) scope {
	return scope{store: true, volume: volumeID, cacheLater: true}
}

// ending is what a transaction that ended a volume leaves to do after
// its locks are released (see volumeLayout.end): the volume's record,
// and for a commit the layer its head replaced and whether it landed.
type ending struct {
	r        *volumeRecord
	replaced string
	landed   bool
}

// endVolume runs fn, which ends volume volumeID, in a transaction over
// sc, then deletes what the volume leaves, without the locks: Commit,
// Discard and End share it.
func (s *Store) endVolume(ctx context.Context, sc scope, fn func(t *txn) (ending, error)) error {
	if err := ValidateName("volume", sc.volume); err != nil {
		return err
	}
	var e ending
	err := s.transact(ctx, sc, func(t *txn) (err error) {
		e, err = fn(t)
		return err
	})
	if err != nil {
		return err
	}
	s.layoutOf(e.r.Layout).end(e.r, e.replaced, e.landed)
	s.sweepIfOrphaned(e.r)
	return nil
}

// commitIn commits the live volume (liveVolume) of t, a transaction over
// commitScope: it seals the volume, locks its cache and lands the layer.
func (s *Store) commitIn(ctx context.Context, t *txn) (CommitResult, ending, error) {
	sealed, err := s.sealEarly(t)
	if err != nil {
		return CommitResult{}, ending{}, err
	}
	if err := t.lockCache(ctx); err != nil {
		if sealed != nil {
			err = s.remountAfter(t, err)
		}
		return CommitResult{}, ending{}, err
	}
	e := ending{r: t.Volume}
	if e.r == nil { // it had landed (see txn.recordRead)
		return CommitResult{}, e, volumeGone(t.volID)
	}
	if t.Head != nil && len(t.Head.Layers) > 0 {
		e.replaced = t.Head.Layers[0].ID
	}
	res, err := s.commitLocked(t, sealed)
	e.landed = res.Layer != ""
	return res, e, err
}

// liveVolume is t's volume, or ErrNotFound if there is none or its
// commit landed. The head is peeked at without the cache's lock: only a
// commit of this volume, which needs the volume's lock t holds, can land
// its layer.
func (s *Store) liveVolume(t *txn) (*volumeRecord, error) {
	if t.Volume == nil || s.landed(t.Volume) {
		return nil, volumeGone(t.volID)
	}
	return t.Volume, nil
}

// volumeGone is the error of a volume that does not exist or has ended.
func volumeGone(id string) error { return fmt.Errorf("volume %q: %w", id, ErrNotFound) }

// sealResult is what sealing a volume found, before its cache is locked.
type sealResult struct {
	layer *LayerInfo // nil for a volume without changes
	err   error      // an *overLimitError, the only error that is kept
}

// sealEarly seals a live volume (liveVolume) before its cache is
// locked; nil if this volume is sealed under the cache's lock instead
// (one whose layout seals under it, a torn one). On an error the volume
// is remounted.
func (s *Store) sealEarly(t *txn) (*sealResult, error) {
	r := t.Volume
	if !s.layoutOf(r.Layout).sealsUnlocked() || r.Torn {
		return nil, nil
	}
	layer, err := s.layoutOf(r.Layout).seal(r)
	var over *overLimitError
	if err != nil && !errors.As(err, &over) {
		return nil, s.remountAfter(t, err)
	}
	return &sealResult{layer: layer, err: err}, nil
}

// remountAfter keeps a volume whose commit failed with err usable for a
// retry; its record is unchanged.
func (s *Store) remountAfter(t *txn, err error) error {
	if merr := s.ensureMounted(t); merr != nil {
		err = fmt.Errorf("%w (the volume stays unmounted until the commit is retried: %v)", err, merr)
	}
	return err
}

// commitLocked commits (or, torn or over its limit, discards) the
// transaction's volume and saves the result; on success the volume is
// gone. sealed is what sealEarly found, or nil to seal here.
func (s *Store) commitLocked(t *txn, sealed *sealResult) (CommitResult, error) {
	r := t.Volume
	res := CommitResult{Cache: r.Cache, Torn: r.Torn}
	if r.Torn {
		return res, s.discardInstead(t, &res)
	}
	var layer *LayerInfo
	var err error
	switch {
	case sealed != nil:
		layer, err = sealed.layer, sealed.err
	default:
		layer, err = s.layoutOf(r.Layout).seal(r)
	}
	var over *overLimitError
	if errors.As(err, &over) {
		res.OverLimit, res.Bytes = true, over.bytes
		return res, s.discardInstead(t, &res)
	}
	if err == nil {
		res, err = s.land(t, layer)
	}
	if err != nil && t.Volume != nil {
		err = s.remountAfter(t, err)
	}
	if err != nil {
		return CommitResult{}, err
	}
	return res, nil
}

// land appends the sealed layer to the head and removes the volume, in one
// save: the head's write is the commit's one point of no return.
func (s *Store) land(t *txn, layer *LayerInfo) (CommitResult, error) {
	r := t.Volume
	res := CommitResult{Cache: r.Cache}
	t.Volume = nil
	if r.SeededFrom != nil && layer != nil && t.landSeeded(r) {
		res.SeededFrom = r.SeededFrom
	}
	h := t.Head
	if h == nil && r.SeededFrom != nil {
		return res, t.save() // no changes: a seeded volume creates nothing
	}
	// A seeded volume lands on whatever head its cache has now (see
	// landSeeded); any other needs the incarnation it was mounted on.
	if h == nil || (h.UID != r.CacheUID && r.SeededFrom == nil) {
		// The cache was removed while the volume was in use: the removal
		// asked for its contents to go, so this volume's changes go too.
		res.Dropped = true
		return res, t.save()
	}
	ondisk.FaultPoint() // the layer is sealed, the head not yet written
	if layer != nil {
		s.layoutOf(h.Layout).push(h, *layer, r)
		res.Layer, res.Bytes = layer.ID, layer.Bytes
	}
	res.Generation = h.Generation
	res.NeedsSquash = len(h.Layers) > s.opts.MaxLayers
	if err := t.save(); err != nil {
		// The head on disk tells whether the layer landed (a failed
		// fsync may follow a done rename); if not, the volume lives on.
		if onDisk, herr := s.readHead(r.Cache); herr != nil || !r.landedIn(onDisk) {
			t.Volume = r
		}
		return CommitResult{}, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	return res, nil
}

// push makes layer the head's newest, committed by volume r.
func (h *head) push(layer LayerInfo, r *volumeRecord) {
	h.Layers = append([]LayerInfo{layer}, h.Layers...)
	h.Generation++
	h.LastUsed = time.Now().UTC()
	h.LastWriter = r.Writer
	if h.LastWriter == "" {
		h.LastWriter = r.ID
	}
}

// discardInstead ends a volume that may not be committed as Discard does,
// and sets res.Generation to the cache's as it stands.
func (s *Store) discardInstead(t *txn, res *CommitResult) error {
	if _, err := s.discardIn(t); err != nil {
		return err
	}
	if t.Head != nil {
		res.Generation = t.Head.Generation
	}
	return t.save()
}

// overLimitError is a volume whose changes are larger than its limit.
type overLimitError struct{ bytes, limit int64 }

func (e *overLimitError) Error() string {
	return fmt.Sprintf("the volume's changes take %d bytes, more than its limit of %d", e.bytes, e.limit)
}

// Discard unmounts and removes the volume; its changes are lost.
func (s *Store) Discard(ctx context.Context, volumeID string) error {
	return s.endVolume(ctx, scope{volume: volumeID}, s.discardIn)
}

// discardIn unmounts and removes the volume of t, whose cache is locked
// (a volume whose commit landed reads as none).
func (s *Store) discardIn(t *txn) (ending, error) {
	r := t.Volume
	if r == nil {
		return ending{}, volumeGone(t.volID)
	}
	if err := ondisk.Unmount(r.MergedPath); err != nil {
		return ending{}, fmt.Errorf("discard volume %q: %w", r.ID, err)
	}
	t.Volume = nil
	return ending{r: r}, nil
}

// sweepIfOrphaned removes the layers an ended volume was the last user of
// (its cache was squashed or removed meanwhile). It never waits: if another
// operation holds the store, the next sweep or GC removes them.
func (s *Store) sweepIfOrphaned(r *volumeRecord) {
	h, err := s.readHead(r.Cache)
	for _, id := range r.Layers {
		if (err != nil || !h.hasLayer(id)) && !s.seedNames(r, id) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // one attempt at the lock, no waiting
			s.sweepLayers(ctx)
			return
		}
	}
}
