package lazyfs

import (
	"fmt"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/loop"
)

// mountFlags are those of every layer image's mount (layerfs/images): a
// layer holds whatever a build wrote, and its mount never runs set-id
// programs or opens devices.
const mountFlags = unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID

// MountImage mounts the image served at file (a lazyfs's, this process's
// or a sidecar's) at target through a read-only loop device, which frees
// itself at the unmount (autoclear).
func MountImage(file, target string) error {
	dev, f, err := loop.Attach(file, true)
	if err != nil {
		return fmt.Errorf("%w (mounting a layer before its bytes are here needs loop devices: modprobe loop, and run the agent privileged with /dev)", err)
	}
	defer f.Close() // after the mount holds the device
	if err := unix.Mount(dev, target, "erofs", mountFlags, ""); err != nil {
		return fmt.Errorf("mount -t erofs -o ro,nodev,nosuid %s (image %s) %s: %w", dev, file, target, err)
	}
	return nil
}

// SettleImage switches the device mounted at target from the served
// image file to local, the complete image on local disk (same size and
// bytes): reads no longer pass through user space. The server may stop
// serving file then.
func SettleImage(file, target, local string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil {
		return fmt.Errorf("read the mount at %s: %w", target, err)
	}
	if len(mounts) != 1 {
		return fmt.Errorf("settle image %s: nothing is mounted at %s", file, target)
	}
	dev := mounts[0].Source
	if backing, err := loop.BackingFile(dev); err != nil || backing != file {
		return fmt.Errorf("settle image %s: %s is mounted at %s, which is not a loop device over it (%q, %v)", file, dev, target, backing, err)
	}
	if err := loop.ChangeFile(dev, local); err != nil {
		return fmt.Errorf("settle image %s at %s: %w", file, target, err)
	}
	return nil
}
