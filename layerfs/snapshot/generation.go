package snapshot

import "fmt"

// A commit makes a volume's subvolume a read-only generation: constant
// time, btrfs snapshots copy no data. With simple quotas each extent is
// charged to the subvolume that wrote it, so a cache's size is the sum of
// the qgroups of the volumes whose commits made it: its lineage, which the
// store keeps with the cache's head.

// Usage is what a volume's subvolume holds, from qgroup numbers as the
// last transaction left them.
type Usage struct {
	subvol  qgroupUsage
	written int64
}

// Written is what the volume wrote: its volumeQgroup's exclusive bytes,
// which count the subvolumes a build nested in it, where it has one, else
// its subvolume's.
func (u Usage) Written() int64 { return u.written }

// VolumeUsage reads volume id's usage; zero if the filesystem keeps none
// for it (quotas turned off behind the store's back).
func (a *Area) VolumeUsage(id string) (Usage, error) {
	subvol, err := subvolumeID(a.VolumePath(id))
	if err != nil {
		return Usage{}, err
	}
	all, err := qgroups(a.Dir())
	if err != nil {
		return Usage{}, err
	}
	u := Usage{subvol: qgroupUsage{ID: subvol}}
	for _, q := range all {
		if q.ID == subvol {
			u.subvol = q
		}
	}
	u.written = a.written(u.subvol)
	return u, nil
}

// written is Usage.Written of the subvolume whose usage is usage.
func (a *Area) written(usage qgroupUsage) int64 {
	groups, err := volumeQgroups(a.Dir())
	if err != nil {
		return usage.Excl
	}
	for _, g := range groups {
		if g.ID == volumeQgroup(usage.ID) {
			return g.Excl
		}
	}
	return usage.Excl
}

// Freeze makes volume id's subvolume, whose usage is u, the read-only
// generation gen (replacing what a failed attempt left) and returns the
// generation's size. lineage is the qgroups of the cache it will head
// (see Lineage).
func (a *Area) Freeze(id, gen string, u Usage, lineage []uint64) (int64, error) {
	if err := a.DeleteGeneration(gen); err != nil {
		return 0, err
	}
	if err := snapshotSubvolume(a.VolumePath(id), a.GenerationPath(gen), true); err != nil {
		return 0, err
	}
	bytes, err := a.generationBytes(u, lineage)
	if err != nil {
		return 0, fmt.Errorf("measure generation %s: %w", gen, err)
	}
	return bytes, nil
}

// generationBytes is the size of the generation a volume of usage u
// becomes. Full qgroups: the volume's referenced bytes, all it holds,
// shared or not. Simple quotas: the sum over the cache's lineage and
// this volume. It still counts what this volume deleted until the kernel
// has freed the old generation in the background (within a commit
// interval, 30 s): an upper bound, exact at the next commit after that.
func (a *Area) generationBytes(u Usage, lineage []uint64) (int64, error) {
	simple, err := simpleQuotas(a.Dir())
	if err != nil || !simple {
		return u.subvol.Referenced, err
	}
	all, err := qgroups(a.Dir())
	if err != nil {
		return 0, err
	}
	ids := map[uint64]bool{u.subvol.ID: true}
	for _, id := range lineage {
		ids[id] = true
	}
	var sum int64
	for _, q := range all {
		if ids[q.ID] {
			sum += q.Referenced
		}
	}
	return sum, nil
}

// Lineage is the lineage of a cache that was lineage before the commit of
// the volume whose subvolume is subvol: that subvolume added, and the
// qgroups that are gone or empty (their data freed) left out.
func (a *Area) Lineage(lineage []uint64, subvol uint64) []uint64 {
	all, err := qgroups(a.Dir())
	if err != nil {
		return append(lineage, subvol) // pruned at the next commit
	}
	used := map[uint64]bool{}
	for _, q := range all {
		used[q.ID] = q.Referenced > 0
	}
	var ids []uint64
	for _, id := range lineage {
		if used[id] && id != subvol {
			ids = append(ids, id)
		}
	}
	return append(ids, subvol)
}

// GenerationID is generation gen's subvolume (and qgroup) id.
func (a *Area) GenerationID(gen string) (uint64, error) {
	return subvolumeID(a.GenerationPath(gen))
}

// QgroupIDs lists the area's level-0 qgroups (one a subvolume).
func (a *Area) QgroupIDs() ([]uint64, error) {
	all, err := qgroups(a.Dir())
	ids := make([]uint64, len(all))
	for i, q := range all {
		ids[i] = q.ID
	}
	return ids, err
}
