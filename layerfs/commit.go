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
func (s *Store) Commit(ctx context.Context, volumeID string) (CommitResult, error) {
	if err := ValidateName("volume", volumeID); err != nil {
		return CommitResult{}, err
	}
	var res CommitResult
	var ended *volumeRecord
	var replaced string // the head's newest layer before the commit
	err := s.transact(ctx, scope{store: true, volume: volumeID, cacheLater: true}, func(t *txn) error {
		r := t.Volume
		switch {
		case r == nil:
			return fmt.Errorf("volume %q: %w", volumeID, ErrNotFound)
		case r.ReadOnly:
			return fmt.Errorf("volume %q is a read-only view of cache %s and cannot be committed; discard it", volumeID, r.Cache)
		}
		sealed, err := s.sealEarly(t)
		if err != nil {
			return err
		}
		if err := t.lockCache(ctx); err != nil {
			if sealed != nil {
				err = s.remountAfter(t, err)
			}
			return err
		}
		if t.Volume == nil { // it had landed (see snapshot)
			return fmt.Errorf("volume %q: %w", volumeID, ErrNotFound)
		}
		ended = t.Volume
		if t.Head != nil && len(t.Head.Layers) > 0 {
			replaced = t.Head.Layers[0].ID
		}
		res, err = s.commitLocked(t, sealed)
		return err
	})
	if err != nil {
		return res, err
	}
	s.layoutOf(ended.Layout).end(ended, replaced, res.Layer != "")
	s.sweepIfOrphaned(ended)
	return res, nil
}

// sealResult is what sealing a volume found, before its cache is locked.
type sealResult struct {
	layer *LayerInfo // nil for a volume without changes
	err   error      // an *overLimitError, the only error that is kept
}

// sealEarly seals a volume before its cache is locked; nil if this
// volume is sealed under the cache's lock instead (one whose layout
// seals under it, a torn one, one whose layer has landed already). On
// an error the volume is remounted.
func (s *Store) sealEarly(t *txn) (*sealResult, error) {
	r := t.Volume
	if !s.layoutOf(r.Layout).sealsUnlocked() || r.Torn {
		return nil, nil
	}
	// Peeked without the cache's lock: only a commit of this volume,
	// which needs the volume's lock we hold, can land its layer.
	if h, err := s.readHead(r.Cache); err == nil && r.landedIn(h) {
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
	if err := ondisk.Unmount(t.Volume.MergedPath); err != nil {
		return fmt.Errorf("discard volume %q: %w", t.Volume.ID, err)
	}
	if t.Head != nil {
		res.Generation = t.Head.Generation
	}
	t.Volume = nil
	return t.save()
}

// overLimitError is a volume whose changes are larger than its limit.
type overLimitError struct{ bytes, limit int64 }

func (e *overLimitError) Error() string {
	return fmt.Sprintf("the volume's changes take %d bytes, more than its limit of %d", e.bytes, e.limit)
}

// Discard unmounts and removes the volume; its changes are lost.
func (s *Store) Discard(ctx context.Context, volumeID string) error {
	if err := ValidateName("volume", volumeID); err != nil {
		return err
	}
	var ended *volumeRecord
	err := s.transact(ctx, scope{volume: volumeID}, func(t *txn) error {
		if t.Volume == nil {
			return fmt.Errorf("volume %q: %w", volumeID, ErrNotFound)
		}
		if err := ondisk.Unmount(t.Volume.MergedPath); err != nil {
			return fmt.Errorf("discard volume %q: %w", volumeID, err)
		}
		ended, t.Volume = t.Volume, nil
		return nil
	})
	if err != nil {
		return err
	}
	s.layoutOf(ended.Layout).end(ended, "", false)
	s.sweepIfOrphaned(ended)
	return nil
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
