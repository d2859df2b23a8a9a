package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
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
	for dir, refs := range map[string]map[string]bool{s.generationsDir(): gens, s.snapVolumesDir(): vols} {
		n, freed, err := s.deleteUnnamed(dir, refs, usage)
		res.RemovedLayers += n
		res.FreedBytes += freed
		if err != nil {
			return res, err
		}
	}
	s.sweepQgroups(usage)
	return res, nil
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
// their exclusive bytes.
func (s *Store) deleteUnnamed(dir string, refs map[string]bool, usage map[uint64]qgroupUsage) (n int, freed int64, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range entries {
		if refs[e.Name()] {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !isSubvolume(path) {
			if err := os.RemoveAll(path); err != nil {
				return n, freed, fmt.Errorf("remove leftover %s: %w", path, err)
			}
			continue
		}
		if id, err := subvolumeID(path); err == nil {
			freed += usage[id].Excl
		}
		if err := deleteSubvolume(path); err != nil {
			return n, freed, err
		}
		n++
	}
	return n, freed, nil
}

// sweepQgroups removes the empty level-0 qgroups whose subvolume is
// gone (a crash between a subvolume's deletion and its qgroup's, or a
// qgroup the kernel still held busy then). A qgroup of a live subvolume
// (this store's or the host's, on a btrfs root) is never touched: its
// subvolume's root item still exists. Nor is one that still counts
// bytes: with simple quotas, a committed volume's qgroup carries the data
// it wrote for as long as a generation holds it (head.Qgroups).
func (s *Store) sweepQgroups(usage map[uint64]qgroupUsage) {
	for id, q := range usage {
		if id < btrfsFirstFreeObjectID || id>>48 != 0 || q.Referenced != 0 || q.Excl != 0 {
			continue // not a subvolume's qgroup, or still in use
		}
		if live, err := subvolumeExists(s.snapshotDir(), id); err != nil || live {
			continue
		}
		err := destroyQgroup(s.snapshotDir(), id)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			continue // best effort: the next sweep tries again
		}
	}
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
