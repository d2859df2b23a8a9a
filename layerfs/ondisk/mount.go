package ondisk

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// ErrBusy is returned (wrapped) when a volume's mount is still in use.
var ErrBusy = errors.New("busy")

// Unmount removes the mount at target; EBUSY (still in use) is ErrBusy. Not
// lazily: a layer must never be written after it is committed.
func Unmount(target string) error {
	for range 8 { // a mount point may carry stacked mounts
		if !IsMountPoint(target) {
			return nil
		}
		FaultPoint()
		if err := unmountOnce(target); err != nil {
			return err
		}
	}
	if IsMountPoint(target) {
		return fmt.Errorf("unmount %s: still mounted after repeated unmounts", target)
	}
	return nil
}

// busyRetries bound how long unmountOnce waits out a busy mount: about
// 300 ms in all. Anything that looks up a path on the mount holds it for a
// moment (the kubelet's filesystem stats, a listing); only a mount busy for
// longer is in use.
var busyRetries = []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 150 * time.Millisecond}

func unmountOnce(target string) error {
	for i := 0; ; i++ {
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT):
			return nil
		case !errors.Is(err, unix.EBUSY):
			return fmt.Errorf("unmount %s: %w", target, err)
		case i == len(busyRetries):
			return fmt.Errorf("unmount %s: the volume is still in use (a process has files open or a bind mount remains): %w", target, ErrBusy)
		}
		time.Sleep(busyRetries[i])
	}
}

// IsMountPoint tells whether something is mounted at path: a mount root has
// another device than its parent directory (an overlay gets its own).
func IsMountPoint(path string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Lstat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// FSTypeName names the filesystem that holds path, for messages.
func FSTypeName(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "unknown"
	}
	names := map[int64]string{
		unix.EXT4_SUPER_MAGIC: "ext4", unix.XFS_SUPER_MAGIC: "xfs", unix.BTRFS_SUPER_MAGIC: "btrfs",
		unix.TMPFS_MAGIC: "tmpfs", unix.OVERLAYFS_SUPER_MAGIC: "overlay", unix.NFS_SUPER_MAGIC: "nfs",
		unix.FUSE_SUPER_MAGIC: "fuse",
	}
	if n, ok := names[int64(st.Type)]; ok {
		return n
	}
	return fmt.Sprintf("0x%x", st.Type)
}
