package snapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Sweep deletes every subvolume of the area that gens (generations) and
// vols (volumes) do not name: what crashes and failed steps left, and
// what ended volumes and removed caches no longer need. Then it removes
// the qgroups that deleted subvolumes left. removed counts the deleted
// subvolumes, freed their exclusive bytes. The caller keeps anyone from
// naming a new subvolume meanwhile (the store lock, exclusive).
func (a *Area) Sweep(gens, vols map[string]bool) (removed int, freed int64, err error) {
	usage := map[uint64]qgroupUsage{}
	if all, err := qgroups(a.Dir()); err == nil {
		for _, q := range all {
			usage[q.ID] = q
		}
	}
	var errs []error
	for dir, refs := range map[string]map[string]bool{a.GenerationsDir(): gens, a.VolumesDir(): vols} {
		n, bytes, err := deleteUnnamed(dir, refs, usage)
		removed += n
		freed += bytes
		errs = append(errs, err)
	}
	a.sweepQgroups(usage)
	return removed, freed, errors.Join(errs...)
}

// deleteUnnamed deletes the entries of dir that refs lacks; freed counts
// their exclusive bytes. An entry it cannot delete is reported and
// passed: the next ones still go, so one bad entry never stops every
// later sweep from freeing space.
func deleteUnnamed(dir string, refs map[string]bool, usage map[uint64]qgroupUsage) (n int, freed int64, err error) {
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
// it wrote for as long as a generation holds it (a cache's lineage).
func (a *Area) sweepQgroups(usage map[uint64]qgroupUsage) {
	for id, q := range usage {
		if id < btrfsFirstFreeObjectID || id>>48 != 0 {
			continue // not a subvolume's qgroup
		}
		a.destroyIfGone(id, id, q)
	}
	// The volumes' level-1 qgroups go once their subvolume's has: the
	// kernel refuses (EBUSY) to destroy a qgroup that still has members.
	groups, err := volumeQgroups(a.Dir())
	if err != nil {
		return
	}
	for _, g := range groups {
		a.destroyIfGone(g.ID, g.ID&(1<<48-1), g)
	}
}

// destroyIfGone destroys qgroup id if it counts no bytes and subvolume
// subvol is gone. Best effort: the next sweep tries again.
func (a *Area) destroyIfGone(id, subvol uint64, q qgroupUsage) {
	if q.Referenced != 0 || q.Excl != 0 {
		return // still in use
	}
	if live, err := subvolumeExists(a.Dir(), subvol); err != nil || live {
		return
	}
	destroyQgroup(a.Dir(), id)
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
