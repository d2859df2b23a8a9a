package layerfs

import (
	"context"
	"fmt"
	"path/filepath"
)

// The store's old layout kept a volume's upper directory at
// volumes/<id>/upper and moved it into layers/ at commit, recording the
// move's intent in the volume's record first. Recover moves such upper
// directories to their home under layers/ and finishes the commits it
// finds recorded; nothing else reads the old layout.

// legacyStateCommitting is the State of an old record whose commit was
// decided: the upper directory was synced and the volume unmounted.
const legacyStateCommitting = "committing"

// legacyCommit is what an old record says of a commit under way.
type legacyCommit struct {
	State string `json:"state,omitempty"`
	// CommitLayer is the layer the upper directory was becoming, at
	// layers/<ID> once moved; nil for a commit without changes.
	CommitLayer *LayerInfo `json:"commitLayer,omitempty"`
}

func (s *Store) legacyUpperDir(id string) string { return filepath.Join(s.volumeDir(id), "upper") }

// ownLayers are the layers under layers/ the volume names as its own.
func (r *volumeRecord) ownLayers() []string {
	var ids []string
	if r.Upper != "" {
		ids = append(ids, r.Upper)
	}
	if r.CommitLayer != nil {
		ids = append(ids, r.CommitLayer.ID)
	}
	return ids
}

// needsMigration tells an old record, or one whose upper directory a crash
// kept from moving to where the record says.
func (s *Store) needsMigration(r *volumeRecord) bool {
	return r.Upper == "" || r.State == legacyStateCommitting ||
		(!exists(s.layerDir(r.Upper)) && exists(s.legacyUpperDir(r.ID)))
}

// migrateVolume brings one volume to the current layout under its lock.
func (s *Store) migrateVolume(ctx context.Context, id string, res *RecoverResult) error {
	return s.transact(ctx, scope{store: true, volume: id}, func(t *txn) error {
		switch {
		case t.Volume == nil || !s.needsMigration(t.Volume):
			return nil // discarded or migrated meanwhile
		case t.Volume.State == legacyStateCommitting:
			if err := s.finishLegacyCommit(t); err != nil {
				return fmt.Errorf("finish commit: %w", err)
			}
			res.RolledForward = append(res.RolledForward, id)
			return nil
		}
		return s.moveLegacyUpper(t)
	})
}

// moveLegacyUpper records the upper directory's new home, then moves it
// there: a crash in between leaves a record that says where to move it,
// and a crash before leaves the old record. A mounted volume keeps
// working: the overlay holds its upper directory, not the path.
func (s *Store) moveLegacyUpper(t *txn) error {
	r := t.Volume
	if r.Upper == "" {
		r.Upper = randomID()
		if err := t.save(); err != nil {
			return fmt.Errorf("record the new home of the upper directory: %w", err)
		}
	}
	if err := renameDurable(s.legacyUpperDir(r.ID), s.layerDir(r.Upper)); err != nil {
		return fmt.Errorf("move the upper directory to layers/%s: %w", r.Upper, err)
	}
	return nil
}

// finishLegacyCommit lands a commit the old layout recorded, as that
// layout's Recover did: the decision was made and the data synced, so it
// rolls forward. A commit whose cache was removed meanwhile is dropped.
func (s *Store) finishLegacyCommit(t *txn) error {
	r, h, l := t.Volume, t.Head, t.Volume.CommitLayer
	t.Volume = nil
	if l == nil || h == nil || h.UID != r.CacheUID || h.hasLayer(l.ID) {
		return t.save()
	}
	if !exists(s.layerDir(l.ID)) {
		if err := stripControlDir(s.legacyUpperDir(r.ID)); err != nil {
			return err
		}
		if err := renameDurable(s.legacyUpperDir(r.ID), s.layerDir(l.ID)); err != nil {
			return fmt.Errorf("move upper layer into the store: %w", err)
		}
	}
	h.push(*l, r)
	return t.save()
}
