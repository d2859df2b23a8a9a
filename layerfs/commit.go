package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	var oldHead string // a snapshot cache's generation before the commit
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
			oldHead = t.Head.Layers[0].ID
		}
		res, err = s.commitLocked(t, sealed)
		return err
	})
	if err != nil {
		return res, err
	}
	if ended.Layout == LayoutSnapshot {
		s.endSnapshotVolume(ended, oldHead)
	}
	if res.Layer == "" {
		os.RemoveAll(s.layerDir(ended.Upper)) // named by nothing now; else the sweep removes it
	}
	s.sweepIfOrphaned(ended)
	return res, nil
}

// sealResult is what sealing a volume found, before its cache is locked.
type sealResult struct {
	layer *LayerInfo // nil for a volume without changes
	err   error      // an *overLimitError, the only error that is kept
}

// sealEarly seals an overlay volume before its cache is locked; nil if
// this volume is sealed under the cache's lock instead (a snapshot
// volume, a torn one, one whose layer has landed already). On an error
// the volume is remounted.
func (s *Store) sealEarly(t *txn) (*sealResult, error) {
	r := t.Volume
	if r.Layout == LayoutSnapshot || r.Torn {
		return nil, nil
	}
	// Peeked without the cache's lock: only a commit of this volume,
	// which needs the volume's lock we hold, can land its layer.
	if h, err := s.readHead(r.Cache); err == nil && r.landedIn(h) {
		return nil, nil
	}
	layer, err := s.seal(r)
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
	case r.Layout == LayoutSnapshot:
		layer, err = s.sealSnapshot(r)
	default:
		layer, err = s.seal(r)
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

// seal unmounts the volume and readies its upper directory to be a layer:
// the control directory moved aside, the data on disk, the size measured.
// layer is nil for a volume without changes.
func (s *Store) seal(r *volumeRecord) (layer *LayerInfo, err error) {
	if err := ondisk.Unmount(r.MergedPath); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	upper := s.upperDir(r)
	if err := s.moveControlAside(r.ID, upper); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	if empty, err := upperIsEmpty(upper); err != nil || empty {
		return nil, err
	}
	// The volume was mounted volatile: its data reaches the disk here,
	// before the head points at it. One syncfs beats an fsync per file
	// for the thousands of small files a build writes, and concurrent
	// commits share it.
	if err := s.syncs.sync(upper); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	if err := s.clearVolatileMarker(r.ID); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	bytes, files, err := diskUsage(upper)
	if err != nil {
		return nil, fmt.Errorf("commit volume %q: measure upper layer: %w", r.ID, err)
	}
	if r.LimitBytes > 0 && bytes > r.LimitBytes {
		return nil, &overLimitError{bytes: bytes, limit: r.LimitBytes}
	}
	return &LayerInfo{ID: r.Upper, Bytes: bytes, Files: files, Created: time.Now().UTC()}, nil
}

// clearVolatileMarker removes the kernel's mark of a volatile mount, once
// the upper layer is on disk: a remount after a crash from here on must not
// take the synced layer for torn (see checkTorn).
func (s *Store) clearVolatileMarker(id string) error {
	marker := s.volatileMarker(id)
	if !ondisk.Exists(marker) {
		return nil
	}
	ondisk.FaultPoint()
	if err := os.RemoveAll(marker); err != nil {
		return fmt.Errorf("remove the volatile mount marker: %w", err)
	}
	return ondisk.SyncDir(filepath.Dir(marker))
}

// moveControlAside moves the upper directory's control directory next to
// the volume's record, durably, rather than deleting it: a crash before
// the head is written leaves the volume with the markers that decided to
// commit it (HasControlFile still finds them), and none inside the layer.
// A retry finds the first markers already aside and drops the new ones.
func (s *Store) moveControlAside(id, upper string) error {
	dir := filepath.Join(upper, ControlDir)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if !ondisk.Exists(s.controlAside(id)) {
		if err := ondisk.RenameDurable(dir, s.controlAside(id)); err != nil {
			return fmt.Errorf("move the control directory %s aside: %w", ControlDir, err)
		}
		return nil
	}
	return stripControlDir(upper)
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
		h.push(*layer, r)
		if h.Layout == LayoutSnapshot {
			h.Layers = h.Layers[:1] // one generation holds the whole cache
			h.Qgroups = s.snapshots.Lineage(h.Qgroups, r.SubvolID)
		}
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
	if ended.Layout == LayoutSnapshot {
		s.endSnapshotVolume(ended, "")
	} else if ended.Upper != "" {
		os.RemoveAll(s.layerDir(ended.Upper)) // named by nothing now; else the sweep removes it
	}
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
