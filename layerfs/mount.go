package layerfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Mount creates volume volumeID as a copy-on-write view of opts.Cache and
// mounts it; an unknown cache starts empty. Mounting an existing volume again
// returns it, remounting it if its mount is gone (after a reboot).
//
// The transaction holds the cache's lock until the volume is recorded, so
// that whoever decides under that lock whether the cache is in use (GC,
// RemoveIfUnused) sees it.
func (s *Store) Mount(ctx context.Context, volumeID string, opts MountOptions) (*Volume, error) {
	if err := ValidateName("volume", volumeID); err != nil {
		return nil, err
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Mode == 0 {
		opts.Mode = 0o777
	}
	var vol Volume
	err := s.transact(ctx, scope{store: true, volume: volumeID, cache: opts.Cache}, func(t *txn) error {
		if err := s.checkMountLayout(t, opts); err != nil {
			return err
		}
		if t.Volume == nil {
			if err := s.newVolume(t, volumeID, opts); err != nil {
				return err
			}
		} else if t.Volume.Cache != opts.Cache {
			return fmt.Errorf("volume %q already exists for cache %s, not %s: use another volume name", volumeID, t.Volume.Cache, opts.Cache)
		} else if err := s.ensureMounted(t); err != nil {
			return err
		}
		vol = t.Volume.Volume
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &vol, nil
}

// MaxID is the largest uid or gid a volume root can have: ids are 32-bit,
// and 4294967295 means "unchanged" to chown(2).
const MaxID = 1<<32 - 2

// rootModeBits are the mode bits a volume root may have: permissions, and
// setgid (new files take the directory's group) and sticky (a shared /tmp).
// setuid means nothing on a directory.
const rootModeBits = os.ModePerm | os.ModeSetgid | os.ModeSticky

// Validate checks the options as Mount does, so that a caller (the CLI)
// can refuse bad input before doing any work.
func (o MountOptions) Validate() error {
	if err := o.Cache.Validate(); err != nil {
		return err
	}
	for _, id := range []struct {
		name  string
		value int
	}{{"uid", o.UID}, {"gid", o.GID}} {
		if id.value < 0 || id.value > MaxID {
			return fmt.Errorf("volume root %s %d is out of range: use 0 to %d", id.name, id.value, MaxID)
		}
	}
	if o.LimitBytes < 0 {
		return fmt.Errorf("volume size limit %d is negative: use a number of bytes, or 0 for no limit", o.LimitBytes)
	}
	if err := o.validateFallbacks(); err != nil {
		return err
	}
	if n := labelBytes(o.Labels); n > MaxLabelBytes {
		return fmt.Errorf("volume labels take %d bytes, more than %d: keep fewer or shorter labels", n, MaxLabelBytes)
	}
	if o.Mode&^rootModeBits != 0 {
		return fmt.Errorf("volume root mode 0%o is not allowed: use permission bits, optionally with setgid or sticky, like 0777, 0755, 02775 or 01777 (setuid means nothing on a directory)", unixMode(o.Mode))
	}
	return nil
}

func labelBytes(labels map[string]string) int {
	n := 0
	for k, v := range labels {
		n += len(k) + len(v)
	}
	return n
}

// unixMode is m as chmod(2) bits, for messages.
func unixMode(m os.FileMode) uint32 {
	bits := uint32(m.Perm())
	for flag, bit := range map[os.FileMode]uint32{os.ModeSetuid: 0o4000, os.ModeSetgid: 0o2000, os.ModeSticky: 0o1000} {
		if m&flag != 0 {
			bits |= bit
		}
	}
	return bits
}

// ensureMounted mounts the transaction's volume unless it is mounted. It
// asks the mount table, not the record: a failed operation may have
// unmounted the volume after the record was read.
func (s *Store) ensureMounted(t *txn) error {
	r := t.Volume
	if ondisk.IsMountPoint(r.MergedPath) {
		r.Mounted = true
		return nil
	}
	if r.Layout == LayoutSnapshot {
		return s.ensureSnapshotMounted(t)
	}
	if err := s.checkTorn(t); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	// A volatile overlay leaves a marker in its work directory, and the
	// kernel refuses to mount over it until it is reset.
	if err := resetDir(s.workDir(r.ID)); err != nil {
		return fmt.Errorf("remount volume %q: reset work directory: %w", r.ID, err)
	}
	if err := s.readyLayers(r.Layers); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	if err := s.withReserve(func() error { return s.volumeSpec(r).mount(r.MergedPath) }); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	r.Mounted = true
	return nil
}

// volatileMarker is what the kernel leaves in a volatile overlay's work
// directory. It stays after a clean unmount too (Linux 6.18), so it alone
// does not tell a crash; together with a different boot it does: the node
// went down while the volume was mounted, and what the kernel had not yet
// written of the upper layer is lost.
func (s *Store) volatileMarker(id string) string {
	return filepath.Join(s.workDir(id), "work", "incompat", "volatile")
}

// checkTorn finds a volume whose upper layer a crash may have torn, before
// the remount erases the evidence. It records that first (atomically), then
// empties the upper layer: the volume stays usable, but is never committed.
func (s *Store) checkTorn(t *txn) error {
	r := t.Volume
	boot := bootID()
	if r.BootID == boot || !ondisk.Exists(s.volatileMarker(r.ID)) {
		return nil
	}
	r.Torn, r.BootID, r.Mounted = true, boot, false
	if err := t.save(); err != nil {
		return fmt.Errorf("record that its upper layer may be torn: %w", err)
	}
	if err := resetDir(s.upperDir(r)); err != nil {
		return fmt.Errorf("empty its possibly torn upper layer: %w", err)
	}
	return nil
}

// bootID names the running kernel's boot.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
})

// newVolume creates the volume's directories, its upper directory at its
// home as a layer, records the volume, then mounts it; on any failure
// nothing of it remains (a crash leaves what Recover and the sweep remove).
func (s *Store) newVolume(t *txn, id string, opts MountOptions) (err error) {
	if opts.Layout.orDefault() == LayoutSnapshot {
		return s.newSnapshotVolume(t, id, opts)
	}
	seed, seedLayers, err := s.seedFor(t, opts)
	if err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	r := &volumeRecord{
		Volume: Volume{
			ID: id, Cache: opts.Cache, ReadOnly: opts.ReadOnly, Writer: opts.Writer,
			Created: time.Now().UTC(), LimitBytes: opts.LimitBytes, MergedPath: s.mergedDir(id),
			Labels: opts.Labels,
		},
		Upper: randomID(), BootID: bootID(),
		RootMode: opts.Mode, RootUID: opts.UID, RootGID: opts.GID,
		AllowSetuid: opts.AllowSetuid, AllowDevices: opts.AllowDevices,
	}
	if seed != nil {
		t.seedVolume(r, seed, seedLayers)
	} else {
		t.touchHead()
		r.BaseGeneration, r.Layers, r.CacheUID = t.Head.Generation, t.Head.layerIDs(), t.Head.UID
	}
	defer func() {
		if err != nil {
			ondisk.Unmount(r.MergedPath)
			t.Volume = nil
			t.save() // best effort; Recover removes what is left
			os.RemoveAll(s.layerDir(r.Upper))
			os.RemoveAll(s.volumeDir(id))
		}
	}()
	if err := s.makeVolumeDirs(r); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	t.Volume = r
	if err := t.save(); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	if err := s.readyLayers(r.Layers); err != nil {
		return fmt.Errorf("mount volume %q: %w", id, err)
	}
	if err := s.volumeSpec(r).mount(r.MergedPath); err != nil {
		return fmt.Errorf("mount volume %q: %w", id, err)
	}
	r.Mounted = true
	return nil
}

// makeVolumeDirs creates the volume's work and merged directories and its
// upper directory, which takes the volume root's owner and mode (the
// merged root shows the upper root's).
func (s *Store) makeVolumeDirs(r *volumeRecord) error {
	if err := s.freshVolumeDir(r.ID); err != nil {
		return err
	}
	upper := s.upperDir(r)
	for _, dir := range []string{s.workDir(r.ID), r.MergedPath, upper} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chown(upper, r.RootUID, r.RootGID); err != nil {
		return err
	}
	return os.Chmod(upper, r.RootMode)
}

// lastUsedGranularity is how stale a cache's recorded last use may be.
const lastUsedGranularity = time.Minute

// touchHead records a use of the transaction's cache, creating it if
// needed.
func (t *txn) touchHead() {
	now := time.Now().UTC()
	switch {
	case t.Head == nil:
		t.Head = &head{Cache: t.cache, UID: randomID(), Created: now}
	case now.Sub(t.Head.LastUsed) < lastUsedGranularity:
		return // recent enough for GC; spare the hot path two fsyncs
	}
	t.Head.LastUsed = now
}

// freshVolumeDir creates volumes/<id>, after removing what a crash left of
// an earlier volume of this name.
func (s *Store) freshVolumeDir(id string) error {
	if ondisk.Exists(s.volumeDir(id)) {
		if err := unmountAll(s.volumeDir(id)); err != nil {
			return err
		}
		if err := os.RemoveAll(s.volumeDir(id)); err != nil {
			return err
		}
	}
	return os.Mkdir(s.volumeDir(id), 0o755)
}
