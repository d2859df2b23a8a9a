package layerfs

import (
	"context"
	"fmt"
	"os"
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
		if err := checkMountLayout(t, opts); err != nil {
			return err
		}
		if t.Volume == nil {
			if err := s.layoutOf(opts.Layout).create(t, volumeID, opts); err != nil {
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
	return s.layoutOf(r.Layout).remount(t)
}

// bootID names the running kernel's boot.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
})

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
