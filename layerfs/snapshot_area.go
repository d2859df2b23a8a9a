package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// DefaultSnapshotImageBytes is the size of the sparse btrfs image made for
// snapshot caches on a root that is not btrfs: 20 GiB, of which the file
// takes only what the caches use.
const DefaultSnapshotImageBytes = 20 << 30

// Where snapshot caches live (see snapshot.go):
//
//	snapshot/                     btrfs: a directory of a btrfs root, or
//	                              snapshot.img mounted through a loop device
//	snapshot/generations/<id>     a cache's head generation, read-only subvolume
//	snapshot/volumes/<volume-id>  a volume's writable snapshot
func (s *Store) snapshotDir() string    { return filepath.Join(s.root, "snapshot") }
func (s *Store) snapshotImage() string  { return filepath.Join(s.root, "snapshot.img") }
func (s *Store) generationsDir() string { return filepath.Join(s.snapshotDir(), "generations") }
func (s *Store) snapVolumesDir() string { return filepath.Join(s.snapshotDir(), "volumes") }

func (s *Store) generationPath(id string) string { return filepath.Join(s.generationsDir(), id) }
func (s *Store) snapVolumePath(id string) string { return filepath.Join(s.snapVolumesDir(), id) }

// hasSnapshotArea tells whether snapshot caches were ever used here, so
// that Open brings the area back after a reboot and an overlay-only node
// never needs btrfs.
func (s *Store) hasSnapshotArea() bool {
	return exists(s.snapshotImage()) || exists(s.generationsDir())
}

// ensureSnapshotArea makes snapshot/ a btrfs directory with quotas on,
// creating and mounting the image if the root is not on btrfs. Idempotent
// and cheap once done; safe across processes (its own lock: callers may
// hold the store lock shared).
func (s *Store) ensureSnapshotArea(ctx context.Context) error {
	if s.snapReady.Load() && isBtrfs(s.snapshotDir()) {
		return nil
	}
	l, err := lockFile(ctx, filepath.Join(s.locksDir(), "snapshot-area"), false)
	if err != nil {
		return err
	}
	defer l.unlock()
	if err := s.mountSnapshotArea(); err != nil {
		return fmt.Errorf("prepare the btrfs area for snapshot caches at %s: %w", s.snapshotDir(), err)
	}
	for _, dir := range []string{s.generationsDir(), s.snapVolumesDir()} {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	if err := enableQuotas(s.snapshotDir()); err != nil {
		return fmt.Errorf("%w (snapshot caches need btrfs qgroups for their size limits; a kernel without them cannot host this layout)", err)
	}
	s.snapReady.Store(true)
	return nil
}

// mountSnapshotArea makes snapshot/ exist on btrfs: a plain directory on a
// btrfs root, else the image's mount (made first if missing).
func (s *Store) mountSnapshotArea() error {
	if err := os.Mkdir(s.snapshotDir(), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if isBtrfs(s.root) {
		return nil
	}
	mounted, err := mountinfo.Mounted(s.snapshotDir())
	if err != nil {
		return fmt.Errorf("read the mount table: %w", err)
	}
	if mounted {
		if !isBtrfs(s.snapshotDir()) {
			return fmt.Errorf("something other than btrfs (%s) is mounted at %s: unmount it", fsTypeName(s.snapshotDir()), s.snapshotDir())
		}
		return nil
	}
	if !exists(s.snapshotImage()) {
		if err := s.makeSnapshotImage(); err != nil {
			return err
		}
	}
	return s.mountSnapshotImage()
}

// makeSnapshotImage creates snapshot.img: a sparse file formatted with
// mkfs.btrfs in tmp/, renamed into place once whole, so a crash never
// leaves a half-made image where Open would mount it.
func (s *Store) makeSnapshotImage() (err error) {
	size := s.opts.SnapshotImageBytes
	if size == 0 {
		size = DefaultSnapshotImageBytes
	}
	tmp := filepath.Join(s.tmpDir(), "new-snapshot.img")
	defer func() {
		if tmp != "" {
			os.Remove(tmp)
		}
	}()
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create btrfs image %s: %w", tmp, err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("size btrfs image %s to %d bytes: %w", tmp, size, err)
	}
	mkfs := s.opts.MkfsBtrfs
	if mkfs == "" {
		mkfs = "mkfs.btrfs"
	}
	if out, err := exec.Command(mkfs, "-q", "-f", tmp).CombinedOutput(); err != nil {
		return fmt.Errorf("format the snapshot image with %q -q -f %s: %w: %s (install btrfs-progs, or set the mkfs.btrfs path with --mkfs-btrfs)",
			mkfs, tmp, err, strings.TrimSpace(string(out)))
	}
	if err := renameDurable(tmp, s.snapshotImage()); err != nil {
		return fmt.Errorf("move btrfs image into place: %w", err)
	}
	tmp = ""
	return nil
}

// mountSnapshotImage attaches snapshot.img to a loop device (autoclear)
// and mounts it at snapshot/.
func (s *Store) mountSnapshotImage() error {
	dev, f, err := attachLoop(s.snapshotImage())
	if err != nil {
		return fmt.Errorf("%w (the snapshot layout on a root that is not btrfs needs loop devices: modprobe loop, and run the agent privileged with /dev)", err)
	}
	defer f.Close() // after the mount holds the device; autoclear frees it at unmount
	// No set-id programs or devices through the area itself; volumes'
	// bind mounts choose their own flags. noatime: reads must not change
	// a volume (see snapshotChanged).
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME)
	if err := unix.Mount(dev, s.snapshotDir(), "btrfs", flags, ""); err != nil {
		return fmt.Errorf("mount btrfs image %s (loop device %s) at %s: %w (check that the kernel has btrfs: modprobe btrfs; a damaged image can be moved away, losing the snapshot caches)",
			s.snapshotImage(), dev, s.snapshotDir(), err)
	}
	return nil
}
