package layerfs

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The snapshot layout: a cache is one read-only btrfs subvolume, its head
// generation (snapshot/generations/<id>, named by the head's one layer
// entry). A volume is a writable snapshot of it (snapshot/volumes/<volume
// id>), bind-mounted at the volume's merged path: constant time whatever
// the cache's size. Its record's Upper names the generation a commit will
// make of it, so a landed commit is recognised as overlay's are (landedIn).
// A subvolume exists iff a head or a volume record names it; the sweep
// (snapshot_sweep.go) deletes the rest, which is how a crash between two
// steps is undone.

// checkMountLayout refuses to mount a cache with a layout other than its
// own.
func (s *Store) checkMountLayout(t *txn, opts MountOptions) error {
	switch {
	case t.Head != nil:
		return checkLayout(opts.Cache, t.Head.Layout, opts.Layout)
	case t.Volume != nil:
		return checkLayout(opts.Cache, t.Volume.Layout, opts.Layout)
	}
	return nil
}

// newSnapshotVolume snapshots the head generation (or makes an empty
// subvolume for a new cache), records the volume and bind-mounts it. The
// subvolume comes before the record: a crash between leaves a subvolume
// nothing names, which the sweep deletes.
func (s *Store) newSnapshotVolume(t *txn, id string, opts MountOptions) (err error) {
	if err := s.ensureSnapshotArea(t.ctx); err != nil {
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
			unmount(r.MergedPath)
			t.Volume = nil
			t.save() // best effort; Recover removes what is left
			deleteSubvolume(s.snapVolumePath(id))
			os.RemoveAll(s.volumeDir(id))
		}
	}()
	if err := s.makeSnapshotVolumeDirs(r); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	if err := s.makeVolumeSubvolume(r, h); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	faultPoint() // the subvolume exists, the record not yet
	t.Volume = r
	if err := t.save(); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	if err := bindMount(s.snapVolumePath(id), r); err != nil {
		return fmt.Errorf("mount volume %q: %w", id, err)
	}
	r.Mounted = true
	return nil
}

// makeSnapshotVolumeDirs creates volumes/<id>/merged, after removing
// what a crash left of an earlier volume of this name.
func (s *Store) makeSnapshotVolumeDirs(r *volumeRecord) error {
	if err := s.freshVolumeDir(r.ID); err != nil {
		return err
	}
	return os.Mkdir(r.MergedPath, 0o755)
}

// makeVolumeSubvolume makes the volume's writable subvolume from h's
// generation (empty for a cache without one), gives its root the owner
// and mode the record asks for (as an overlay volume's root shows its
// upper directory's, whatever the cache's root was), sets its size limit
// and records its root.
func (s *Store) makeVolumeSubvolume(r *volumeRecord, h *head) error {
	path := s.snapVolumePath(r.ID)
	if err := deleteSubvolume(path); err != nil { // a crashed attempt's
		return err
	}
	if h != nil && len(h.Layers) > 0 {
		if err := snapshotSubvolume(s.generationPath(h.Layers[0].ID), path, false); err != nil {
			return err
		}
	} else if err := makeEmptySubvolume(path); err != nil {
		return err
	}
	if err := os.Chown(path, r.RootUID, r.RootGID); err != nil {
		return err
	}
	if err := os.Chmod(path, r.RootMode); err != nil {
		return err
	}
	id, err := subvolumeID(path)
	if err != nil {
		return err
	}
	r.SubvolID = id
	if r.LimitBytes > 0 {
		if err := s.limitVolume(id, r.LimitBytes); err != nil {
			return err
		}
	}
	digest, err := rootDigest(path)
	if err != nil {
		return err
	}
	r.RootDigest = digest
	return nil
}

// limitVolume sets the size limit of the volume whose subvolume is id.
// With simple quotas it bounds the volume's qgroup (volumeQgroup), which
// the subvolumes a build nests in it join; full qgroups would have to
// rescan to account a snapshot under a new parent and add nested
// subvolumes to none, so there the limit stays on the subvolume's own
// qgroup (kernels before 6.7, where a nested subvolume escapes it).
func (s *Store) limitVolume(id uint64, bytes int64) error {
	dir := s.snapshotDir()
	simple, err := simpleQuotas(dir)
	if err != nil {
		return err
	}
	if !simple {
		return limitExclusive(dir, id, bytes)
	}
	group := volumeQgroup(id)
	if err := createQgroup(dir, group); err != nil {
		return err
	}
	if err := assignQgroup(dir, id, group); err != nil {
		return err
	}
	return limitExclusive(dir, group, bytes)
}

func makeEmptySubvolume(path string) error {
	if err := createSubvolume(path); err != nil {
		return err
	}
	// Unlike a snapshot, a new subvolume does not commit a transaction:
	// commit one, so that the build's writes come in later ones than
	// the subvolume's birth (snapshotChanged tells changes by that).
	return syncFS(path)
}

// ensureSnapshotMounted mounts a snapshot volume again (after a reboot or
// a failed commit). A volume that was mounted in an earlier boot is torn,
// as overlay volumes are: its build was cut short, so it gets a fresh
// snapshot of the cache and is never committed.
func (s *Store) ensureSnapshotMounted(t *txn) error {
	r := t.Volume
	if err := s.ensureSnapshotArea(t.ctx); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	if r.BootID != bootID() && !r.Torn {
		r.Torn, r.BootID, r.Mounted = true, bootID(), false
		if err := t.save(); err != nil {
			return fmt.Errorf("remount volume %q: record that it may be torn: %w", r.ID, err)
		}
		if err := deleteSubvolume(s.snapVolumePath(r.ID)); err != nil {
			return fmt.Errorf("remount volume %q: drop its possibly torn subvolume: %w", r.ID, err)
		}
	}
	if !isSubvolume(s.snapVolumePath(r.ID)) {
		// Torn, or a crash undid its creation: a fresh one.
		if err := s.makeVolumeSubvolume(r, t.Head); err != nil {
			return fmt.Errorf("remount volume %q: %w", r.ID, err)
		}
		if err := t.save(); err != nil {
			return fmt.Errorf("remount volume %q: %w", r.ID, err)
		}
	}
	if err := bindMount(s.snapVolumePath(r.ID), r); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	r.Mounted = true
	return nil
}

// bindFlags are the flags of a volume's bind mount: nosuid and nodev
// unless lifted (the same rules as overlay volumes), and noatime, so that
// reading a cache does not count as changing it (snapshotChanged).
func bindFlags(r *volumeRecord) (flags uintptr, names []string) {
	flags, names = unix.MS_NOATIME, []string{"noatime"}
	if !r.AllowSetuid {
		flags, names = flags|unix.MS_NOSUID, append(names, "nosuid")
	}
	if !r.AllowDevices {
		flags, names = flags|unix.MS_NODEV, append(names, "nodev")
	}
	return flags, names
}

// bindMount mounts the subvolume src at the volume's merged path. A bind
// mount takes its flags only from a remount.
func bindMount(src string, r *volumeRecord) error {
	if err := unix.Mount(src, r.MergedPath, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s at %s: %w", src, r.MergedPath, err)
	}
	flags, _ := bindFlags(r)
	if err := unix.Mount("", r.MergedPath, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		unmount(r.MergedPath)
		return fmt.Errorf("restrict the bind mount at %s: %w", r.MergedPath, err)
	}
	return nil
}

// bindCommand is the mount(8) equivalent of bindMount, for debugging.
func bindCommand(src string, r *volumeRecord) string {
	_, names := bindFlags(r)
	return fmt.Sprintf("mount --bind %s %s && mount -o remount,bind,%s %s", src, r.MergedPath, strings.Join(names, ","), r.MergedPath)
}

// errIfSnapshot refuses the overlay-only operations (registry export and
// sync) for a snapshot cache.
func errIfSnapshot(h *head, what string) error {
	if h == nil || h.Layout != LayoutSnapshot {
		return nil
	}
	return fmt.Errorf("%s of cache %s: %w: a snapshot cache stays on its node (no registry sync); use the overlay layout for caches shared across nodes", what, h.Cache, ErrSnapshotUnsupported)
}
