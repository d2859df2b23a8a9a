package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/layercache/layercache/layerfs/flock"
	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/snapshot"
	"github.com/layercache/layercache/layerfs/tree"
)

// The snapshot layout: a cache is one read-only btrfs subvolume, its head
// generation (named by the head's one layer entry). A volume is a writable
// snapshot of it, bind-mounted at the volume's merged path: constant time
// whatever the cache's size. Its record's Upper names the generation a
// commit will make of it, so a landed commit is recognised as overlay's
// are (landedIn). The subvolumes themselves are package snapshot's; this
// file keeps the records and heads that name them. A subvolume exists
// iff a head or a volume record names it; the sweep (snapshotLayout.sweep)
// deletes the rest, which is how a crash between two steps is undone.

// DefaultSnapshotImageBytes is the size of the sparse btrfs image made
// for snapshot caches on a root that is not btrfs.
const DefaultSnapshotImageBytes = snapshot.DefaultImageBytes

// snapshotLayout is the snapshot layout of a store (see volumeLayout).
type snapshotLayout struct{ *Store }

// sealsUnlocked is false: a generation's size sums its cache's lineage,
// which the head under the cache's lock tells.
func (s snapshotLayout) sealsUnlocked() bool { return false }

// push makes layer the one generation that holds the whole cache.
func (s snapshotLayout) push(h *head, layer LayerInfo, r *volumeRecord) {
	lineage := h.Qgroups
	if len(h.Layers) == 0 && r.SeededFrom != nil {
		lineage = r.SeedQgroups // it lands as the seed's successor (landSeeded)
	}
	h.push(layer, r)
	h.Layers = h.Layers[:1]
	h.Qgroups = s.snapshots.Lineage(lineage, r.SubvolID)
}

func (s snapshotLayout) upperDir(r *volumeRecord) string { return s.snapshots.VolumePath(r.ID) }

func (s snapshotLayout) changed(r *volumeRecord) (bool, error) {
	return s.snapshots.Changed(r.ID, r.Subvolume)
}

func (s snapshotLayout) mountCommand(r *volumeRecord) string {
	return s.snapshots.MountCommand(r.ID, r.MergedPath, bindFlags(r))
}

// space is the btrfs area's filesystem: the image's own when the root is
// not btrfs. An image runs short on its own, however much the host has
// free, and only its caches can help.
func (s snapshotLayout) space() string { return s.snapshots.Dir() }

// squashes is false: a snapshot cache has one generation.
func (s snapshotLayout) squashes() bool { return false }

// ensureSnapshotArea prepares the btrfs area (snapshot.Area.Prepare).
// Cheap once done; safe across processes (its own lock: callers may hold
// the store lock shared).
func (s *Store) ensureSnapshotArea(ctx context.Context) error {
	if s.snapshots.Ready() {
		return nil
	}
	l, err := flock.Acquire(ctx, filepath.Join(s.locksDir(), "snapshot-area"), false)
	if err != nil {
		return err
	}
	defer l.Unlock()
	return s.snapshots.Prepare()
}

// create snapshots the head generation (or makes an empty
// subvolume for a new cache), records the volume and bind-mounts it. The
// subvolume comes before the record: a crash between leaves a subvolume
// nothing names, which the sweep deletes.
func (s snapshotLayout) create(t *txn, id string, opts MountOptions) (err error) {
	if err := s.ensureSnapshotArea(t.ctx); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	// Before the head is touched: a refused fallback creates nothing.
	seed, _, err := s.seedFor(t, opts)
	if err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	t.touchHead()
	h := t.Head
	h.Layout = LayoutSnapshot
	r := &volumeRecord{
		Volume: Volume{
			ID: id, Cache: opts.Cache, ReadOnly: opts.ReadOnly, Writer: opts.Writer,
			BaseGeneration: h.Generation, Layers: h.layerIDs(), Created: time.Now().UTC(),
			LimitBytes: opts.LimitBytes, MergedPath: s.mergedDir(id), Layout: LayoutSnapshot,
			Labels: opts.Labels,
		},
		CacheUID: h.UID, Upper: randomID(), BootID: bootID(),
		RootMode: opts.Mode, RootUID: opts.UID, RootGID: opts.GID,
		AllowSetuid: opts.AllowSetuid, AllowDevices: opts.AllowDevices,
	}
	defer func() {
		if err != nil {
			ondisk.Unmount(r.MergedPath)
			t.Volume = nil
			t.save() // best effort; Recover removes what is left
			s.snapshots.DeleteVolume(id)
			os.RemoveAll(s.volumeDir(id))
		}
	}()
	if err := s.freshVolumeDir(id); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	if err := os.Mkdir(r.MergedPath, 0o755); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	if err := s.makeSeededSubvolume(t, r, seed); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	ondisk.FaultPoint() // the subvolume exists, the record not yet
	t.Volume = r
	if err := t.save(); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	if err := s.snapshots.Mount(id, r.MergedPath, bindFlags(r)); err != nil {
		return fmt.Errorf("mount volume %q: %w", id, err)
	}
	r.Mounted = true
	return nil
}

// makeSeededSubvolume makes a new volume's subvolume from its cache's
// generation or, for a cache with none, from seed's, the first fallback
// with one (seedFor): a snapshot, constant time whatever its size. The
// fallback's lock is held until the snapshot is taken, so that its next
// commit cannot delete the generation first; past fallbackLockWait
// (see there) the unlocked read stands, and a generation gone meanwhile
// fails the mount, which the kubelet retries.
func (s snapshotLayout) makeSeededSubvolume(t *txn, r *volumeRecord, seed *Seed) error {
	if seed == nil {
		return s.makeVolumeSubvolume(r, t.Head)
	}
	wait, cancel := context.WithTimeout(t.ctx, fallbackLockWait)
	defer cancel()
	if l, err := s.lockCache(wait, seed.Cache); err == nil {
		defer l.Unlock()
	} else if t.ctx.Err() != nil {
		return t.ctx.Err()
	}
	h, err := s.readHead(seed.Cache)
	if err != nil {
		return fmt.Errorf("read fallback %s of cache %s: %w", seed.Cache, r.Cache, err)
	}
	if !hasGeneration(h) || h.Layout != LayoutSnapshot {
		return fmt.Errorf("fallback %s of cache %s changed while the volume was made; mount again", seed.Cache, r.Cache)
	}
	seed.Generation = h.Generation
	t.seedVolume(r, seed, nil)
	r.SeedQgroups = slices.Clone(h.Qgroups)
	return s.makeVolumeSubvolume(r, h)
}

// remakeSubvolume makes a fresh subvolume for volume r: of its
// cache's generation or, for a seeded volume whose cache still has none,
// of its fallback's as it stands now. A torn volume is never committed,
// so a fallback gone meanwhile leaves it empty rather than unmountable.
func (s snapshotLayout) remakeSubvolume(t *txn, r *volumeRecord) error {
	if r.SeededFrom == nil || hasGeneration(t.Head) {
		return s.makeVolumeSubvolume(r, t.Head)
	}
	if err := s.makeSeededSubvolume(t, r, &Seed{Cache: r.SeededFrom.Cache}); err == nil {
		return nil
	}
	return s.makeVolumeSubvolume(r, t.Head)
}

// makeVolumeSubvolume makes the volume's writable subvolume from h's
// generation (empty for a cache without one) and records what it is.
func (s *Store) makeVolumeSubvolume(r *volumeRecord, h *head) error {
	from := ""
	if h != nil && len(h.Layers) > 0 {
		from = h.Layers[0].ID
	}
	root := snapshot.Root{UID: r.RootUID, GID: r.RootGID, Mode: r.RootMode}
	sub, err := s.snapshots.MakeVolume(r.ID, from, root, r.LimitBytes)
	if err != nil {
		return err
	}
	r.Subvolume = sub
	return nil
}

func bindFlags(r *volumeRecord) snapshot.MountFlags {
	return snapshot.MountFlags{AllowSetuid: r.AllowSetuid, AllowDevices: r.AllowDevices}
}

// remount mounts a snapshot volume again (after a reboot or
// a failed commit). A volume that was mounted in an earlier boot is torn,
// as overlay volumes are: its build was cut short, so it gets a fresh
// snapshot of the cache and is never committed.
func (s snapshotLayout) remount(t *txn) error {
	r := t.Volume
	if err := s.ensureSnapshotArea(t.ctx); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	if r.BootID != bootID() && !r.Torn {
		r.Torn, r.BootID, r.Mounted = true, bootID(), false
		if err := t.save(); err != nil {
			return fmt.Errorf("remount volume %q: record that it may be torn: %w", r.ID, err)
		}
		if err := s.snapshots.DeleteVolume(r.ID); err != nil {
			return fmt.Errorf("remount volume %q: drop its possibly torn subvolume: %w", r.ID, err)
		}
	}
	if !s.snapshots.HasVolume(r.ID) {
		// Torn, or a crash undid its creation: a fresh one.
		if err := s.remakeSubvolume(t, r); err != nil {
			return fmt.Errorf("remount volume %q: %w", r.ID, err)
		}
		if err := t.save(); err != nil {
			return fmt.Errorf("remount volume %q: %w", r.ID, err)
		}
	}
	if err := s.snapshots.Mount(r.ID, r.MergedPath, bindFlags(r)); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	r.Mounted = true
	return nil
}

// A snapshot volume's commit: unmount, move the control directory out,
// take a read-only snapshot of the volume as the next generation (named
// by the record's Upper), then swap the head in one atomic write (land,
// shared with overlay volumes). Whole-volume last writer wins: the later
// commit's generation is the head, whatever the earlier one held.
//
// Crash points: before the head's write, the new generation is named by
// nothing and the sweep deletes it (the volume lives on, committable
// again); after it, the volume has landed (landedIn) and its subvolume
// and the old generation are named by nothing, and the sweep deletes
// them. Either way the cache is the old or the new generation.

// seal readies the volume's next generation; nil for a volume
// without changes.
func (s snapshotLayout) seal(r *volumeRecord) (*LayerInfo, error) {
	if err := ondisk.Unmount(r.MergedPath); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	if err := s.moveSnapshotControlAside(r.ID, s.upperDir(r)); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	changed, err := s.snapshots.Changed(r.ID, r.Subvolume)
	if err != nil || !changed {
		if err != nil {
			err = fmt.Errorf("commit volume %q: find its changes: %w", r.ID, err)
		}
		return nil, err
	}
	usage, err := s.snapshots.VolumeUsage(r.ID)
	if err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	// The qgroup limit stops writes past LimitBytes; this is the check
	// for a volume whose limit was set after it was written (or lost).
	if written := usage.Written(); r.LimitBytes > 0 && written > r.LimitBytes {
		return nil, &overLimitError{bytes: written, limit: r.LimitBytes}
	}
	var lineage []uint64
	h, err := s.readHead(r.Cache)
	switch {
	case err == nil && hasGeneration(h) && (h.UID == r.CacheUID || r.SeededFrom != nil):
		lineage = h.Qgroups
	case r.SeededFrom != nil:
		lineage = r.SeedQgroups
	}
	bytes, err := s.snapshots.Freeze(r.ID, r.Upper, usage, lineage)
	if err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	return &LayerInfo{ID: r.Upper, Bytes: bytes, Created: time.Now().UTC()}, nil
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
	if !ondisk.Exists(s.controlAside(id)) {
		tmp := filepath.Join(s.volumeDir(id), "new-control")
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return err
		}
		if err := tree.Copy(dir, tmp, nil); err != nil {
			return fmt.Errorf("copy the control directory %s aside: %w", ControlDir, err)
		}
		if err := ondisk.SyncFS(tmp); err != nil {
			return err
		}
		if err := ondisk.RenameDurable(tmp, s.controlAside(id)); err != nil {
			return fmt.Errorf("move the control directory %s aside: %w", ControlDir, err)
		}
	}
	return stripControlDir(path)
}

// end deletes what an ended snapshot volume leaves: its
// subvolume and, after a commit, the generation the head no longer names
// (btrfs snapshots are independent, so nothing else needs it). Best
// effort: the sweep deletes whatever a failure or a crash leaves.
func (s snapshotLayout) end(r *volumeRecord, oldGeneration string, _ bool) {
	s.snapshots.DeleteVolume(r.ID)
	if oldGeneration == "" {
		return
	}
	if h, err := s.readHead(r.Cache); err == nil && h.hasLayer(oldGeneration) {
		return
	}
	s.snapshots.DeleteGeneration(oldGeneration)
}

// sweep deletes every subvolume that no head and no volume
// record names (snapshot.Area.Sweep). It holds the store lock
// exclusively, as the layer sweep does: mounts and commits create
// subvolumes under it shared.
func (s snapshotLayout) sweep(ctx context.Context) (sweepResult, error) {
	var res sweepResult
	if !ondisk.Exists(s.snapshots.GenerationsDir()) {
		return res, nil // no snapshot cache was ever made here
	}
	if err := s.ensureSnapshotArea(ctx); err != nil {
		return res, err
	}
	l, err := s.lockStore(ctx, true)
	if err != nil {
		return res, err
	}
	defer l.Unlock()
	gens, vols, err := s.snapshotRefs()
	if err != nil {
		return res, err
	}
	res.RemovedLayers, res.FreedBytes, err = s.snapshots.Sweep(gens, vols)
	return res, err
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

// exportDir is the generation's read-only subvolume: its image is the
// whole cache, which a fresh node receives as a generation of its own
// (snapshot_sync.go).
func (s snapshotLayout) exportDir(ctx context.Context, id string) (string, error) {
	if err := s.ensureSnapshotArea(ctx); err != nil {
		return "", err
	}
	return s.snapshots.GenerationPath(id), nil
}
