package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// sweepSnapshots deletes every subvolume under snapshot/ that no head and
// no volume record names: what crashes and failed steps left (a volume's
// snapshot made before its record, a generation made before its head, the
// generation a commit replaced, the subvolume of a volume that ended), and
// the generations of removed caches. Then it removes the qgroups that
// deleted subvolumes left. It holds the store lock exclusively, as the
// layer sweep does: mounts and commits create subvolumes under it shared.
func (s *Store) sweepSnapshots(ctx context.Context) (sweepResult, error) {
	var res sweepResult
	if !exists(s.generationsDir()) {
		return res, nil // no snapshot cache was ever made here
	}
	if err := s.ensureSnapshotArea(ctx); err != nil {
		return res, err
	}
	l, err := s.lockStore(ctx, true)
	if err != nil {
		return res, err
	}
	defer l.unlock()
	gens, vols, err := s.snapshotRefs()
	if err != nil {
		return res, err
	}
	usage := map[uint64]qgroupUsage{}
	if all, err := qgroups(s.snapshotDir()); err == nil {
		for _, q := range all {
			usage[q.ID] = q
		}
	}
	var errs []error
	for dir, refs := range map[string]map[string]bool{s.generationsDir(): gens, s.snapVolumesDir(): vols} {
		n, freed, err := s.deleteUnnamed(dir, refs, usage)
		res.RemovedLayers += n
		res.FreedBytes += freed
		errs = append(errs, err)
	}
	s.sweepQgroups(usage)
	return res, errors.Join(errs...)
}

// snapshotRefs are the generations heads name and the volumes records
// name. Callers hold the store lock exclusively.
func (s *Store) snapshotRefs() (gens, vols map[string]bool, err error) {
	gens, vols = map[string]bool{}, map[string]bool{}
	heads, err := s.heads()
	if err != nil {
		return nil, nil, err
	}
	for _, h := range heads {
		if h.Layout == LayoutSnapshot {
			for _, l := range h.Layers {
				gens[l.ID] = true
			}
		}
	}
	recs, err := s.volumeRecords()
	if err != nil {
		return nil, nil, err
	}
	for _, r := range recs {
		if r.Layout == LayoutSnapshot {
			vols[r.ID] = true
		}
	}
	return gens, vols, nil
}

// deleteUnnamed deletes the entries of dir that refs lacks; freed counts
// their exclusive bytes. An entry it cannot delete is reported and
// passed: the next ones still go, so one bad entry never stops every
// later sweep from freeing space.
func (s *Store) deleteUnnamed(dir string, refs map[string]bool, usage map[uint64]qgroupUsage) (n int, freed int64, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	var errs []error
	for _, e := range entries {
		if refs[e.Name()] {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !isSubvolume(path) {
			if err := os.RemoveAll(path); err != nil {
				errs = append(errs, fmt.Errorf("remove leftover %s: %w", path, err))
			}
			continue
		}
		var bytes int64
		if id, err := subvolumeID(path); err == nil {
			bytes = usage[id].Excl
		}
		if err := deleteSubvolume(path); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
		freed += bytes
	}
	return n, freed, errors.Join(errs...)
}

// sweepQgroups removes the empty qgroups whose subvolume is gone (a
// crash between a subvolume's deletion and its qgroup's, a qgroup the
// kernel still held busy then, a volume's level-1 qgroup). A qgroup of a live subvolume
// (this store's or the host's, on a btrfs root) is never touched: its
// subvolume's root item still exists. Nor is one that still counts
// bytes: with simple quotas, a committed volume's qgroup carries the data
// it wrote for as long as a generation holds it (head.Qgroups).
func (s *Store) sweepQgroups(usage map[uint64]qgroupUsage) {
	for id, q := range usage {
		if id < btrfsFirstFreeObjectID || id>>48 != 0 {
			continue // not a subvolume's qgroup
		}
		s.destroyIfGone(id, id, q)
	}
	// The volumes' level-1 qgroups go once their subvolume's has: the
	// kernel refuses (EBUSY) to destroy a qgroup that still has members.
	groups, err := volumeQgroups(s.snapshotDir())
	if err != nil {
		return
	}
	for _, g := range groups {
		s.destroyIfGone(g.ID, g.ID&(1<<48-1), g)
	}
}

// destroyIfGone destroys qgroup id if it counts no bytes and subvolume
// subvol is gone. Best effort: the next sweep tries again.
func (s *Store) destroyIfGone(id, subvol uint64, q qgroupUsage) {
	if q.Referenced != 0 || q.Excl != 0 {
		return // still in use
	}
	if live, err := subvolumeExists(s.snapshotDir(), subvol); err != nil || live {
		return
	}
	destroyQgroup(s.snapshotDir(), id)
}

// subvolumeExists tells whether the root tree still holds subvolume id
// (deleted ones keep their root item until the cleaner has freed them).
func subvolumeExists(dir string, id uint64) (bool, error) {
	found := false
	err := searchTree(dir, btrfsSearchKey{
		TreeID: btrfsRootTreeID, MinObjectid: id, MaxObjectid: id,
		MinType: btrfsRootItemKey, MaxType: btrfsRootItemKey, MaxOffset: ^uint64(0), MaxTransid: ^uint64(0),
	}, func(h searchHeader, _ []byte) {
		if h.Objectid == id && h.Type == btrfsRootItemKey {
			found = true
		}
	})
	return found, err
}
