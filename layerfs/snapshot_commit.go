package layerfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// A snapshot volume's commit: unmount, move the control directory out,
// take a read-only snapshot of the volume as the next generation
// (snapshot/generations/<Upper>), then swap the head in one atomic write
// (land, shared with overlay volumes). Constant time: btrfs snapshots copy
// no data. Whole-volume last writer wins: the later commit's generation
// is the head, whatever the earlier one held.
//
// Crash points: before the head's write, the new generation is named by
// nothing and the sweep deletes it (the volume lives on, committable
// again); after it, the volume has landed (landedIn) and its subvolume
// and the old generation are named by nothing, and the sweep deletes
// them. Either way the cache is the old or the new generation.

// sealSnapshot readies the volume's next generation; nil for a volume
// without changes.
func (s *Store) sealSnapshot(r *volumeRecord) (*LayerInfo, error) {
	if err := unmount(r.MergedPath); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	path := s.snapVolumePath(r.ID)
	if err := s.moveSnapshotControlAside(r.ID, path); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	changed, err := s.snapshotChanged(r)
	if err != nil || !changed {
		if err != nil {
			err = fmt.Errorf("commit volume %q: find its changes: %w", r.ID, err)
		}
		return nil, err
	}
	usage, err := s.subvolumeUsage(path)
	if err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	// The qgroup limit stops writes past LimitBytes; this is the check
	// for a volume whose limit was set after it was written (or lost).
	if written := s.volumeWritten(usage); r.LimitBytes > 0 && written > r.LimitBytes {
		return nil, &overLimitError{bytes: written, limit: r.LimitBytes}
	}
	gen := s.generationPath(r.Upper)
	if err := deleteSubvolume(gen); err != nil { // what a failed attempt left
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	if err := snapshotSubvolume(path, gen, true); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	bytes, err := s.generationBytes(r, usage)
	if err != nil {
		return nil, fmt.Errorf("commit volume %q: measure it: %w", r.ID, err)
	}
	return &LayerInfo{ID: r.Upper, Bytes: bytes, Created: time.Now().UTC()}, nil
}

// generationBytes is the size of the generation a volume is about to
// become, from qgroup numbers as the last transaction left them. Full
// qgroups: the volume's referenced bytes, all it holds, shared or not.
// Simple quotas charge each extent to the subvolume that wrote it: the
// sum over the cache's lineage (head.Qgroups and this volume). It still
// counts what this volume deleted until the kernel has freed the old
// generation in the background (within a commit interval, 30 s): an
// upper bound, exact at the next commit after that.
func (s *Store) generationBytes(r *volumeRecord, usage qgroupUsage) (int64, error) {
	simple, err := simpleQuotas(s.snapshotDir())
	if err != nil || !simple {
		return usage.Referenced, err
	}
	all, err := qgroups(s.snapshotDir())
	if err != nil {
		return 0, err
	}
	ids := map[uint64]bool{r.SubvolID: true}
	if h, err := s.readHead(r.Cache); err == nil && h.UID == r.CacheUID {
		for _, id := range h.Qgroups {
			ids[id] = true
		}
	}
	var sum int64
	for _, q := range all {
		if ids[q.ID] {
			sum += q.Referenced
		}
	}
	return sum, nil
}

// lineage is h.Qgroups with r's subvolume added and the qgroups that are
// gone or empty (their data freed) left out.
func (s *Store) lineage(h *head, r *volumeRecord) []uint64 {
	all, err := qgroups(s.snapshotDir())
	if err != nil {
		return append(h.Qgroups, r.SubvolID) // pruned at the next commit
	}
	used := map[uint64]bool{}
	for _, q := range all {
		used[q.ID] = q.Referenced > 0
	}
	var ids []uint64
	for _, id := range h.Qgroups {
		if used[id] && id != r.SubvolID {
			ids = append(ids, id)
		}
	}
	return append(ids, r.SubvolID)
}

// moveSnapshotControlAside copies the control directory next to the
// volume's record, durably, then removes it from the subvolume (a rename
// cannot leave btrfs for the store's filesystem). As for overlay volumes,
// a retry finds the first markers aside and drops the new ones.
func (s *Store) moveSnapshotControlAside(id, path string) error {
	dir := filepath.Join(path, ControlDir)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if !exists(s.controlAside(id)) {
		tmp := filepath.Join(s.volumeDir(id), "new-control")
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return err
		}
		if err := copyTree(dir, tmp, nil); err != nil {
			return fmt.Errorf("copy the control directory %s aside: %w", ControlDir, err)
		}
		if err := syncFS(tmp); err != nil {
			return err
		}
		if err := renameDurable(tmp, s.controlAside(id)); err != nil {
			return fmt.Errorf("move the control directory %s aside: %w", ControlDir, err)
		}
	}
	return stripControlDir(path)
}

// subvolumeUsage is the qgroup usage of the subvolume at path; zero if
// the filesystem keeps none for it (quotas turned off behind our back).
func (s *Store) subvolumeUsage(path string) (qgroupUsage, error) {
	id, err := subvolumeID(path)
	if err != nil {
		return qgroupUsage{}, err
	}
	all, err := qgroups(s.snapshotDir())
	if err != nil {
		return qgroupUsage{}, err
	}
	for _, q := range all {
		if q.ID == id {
			return q, nil
		}
	}
	return qgroupUsage{ID: id}, nil
}

// volumeWritten is what a volume wrote: its volumeQgroup's exclusive
// bytes, which count the subvolumes a build nested in it, where it has
// one, else its subvolume's (usage).
func (s *Store) volumeWritten(usage qgroupUsage) int64 {
	groups, err := volumeQgroups(s.snapshotDir())
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

// endSnapshotVolume deletes what an ended snapshot volume leaves: its
// subvolume and, after a commit, the generation the head no longer names
// (btrfs snapshots are independent, so nothing else needs it). Best
// effort: the sweep deletes whatever a failure or a crash leaves.
func (s *Store) endSnapshotVolume(r *volumeRecord, oldGeneration string) {
	deleteSubvolume(s.snapVolumePath(r.ID))
	if oldGeneration == "" {
		return
	}
	if h, err := s.readHead(r.Cache); err == nil && h.hasLayer(oldGeneration) {
		return
	}
	deleteSubvolume(s.generationPath(oldGeneration))
}
