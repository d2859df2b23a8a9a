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

// Mount mounts image name, served here, at target through a read-only
// loop device, which frees itself at the unmount (autoclear).
func (s *Server) Mount(name, target string) error {
	dev, f, err := loop.Attach(s.Path(name), true)
	if err != nil {
		return fmt.Errorf("%w (mounting a layer before its bytes are here needs loop devices: modprobe loop, and run the agent privileged with /dev)", err)
	}
	defer f.Close() // after the mount holds the device
	if err := unix.Mount(dev, target, "erofs", mountFlags, ""); err != nil {
		return fmt.Errorf("mount -t erofs -o ro,nodev,nosuid %s (image %s) %s: %w", dev, name, target, err)
	}
	return nil
}

// Settle switches the device mounted at target from image name's file
// here to local, the complete image on local disk (same size and bytes),
// and stops serving name: reads no longer pass through user space.
func (s *Server) Settle(name, target, local string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil {
		return fmt.Errorf("read the mount at %s: %w", target, err)
	}
	if len(mounts) != 1 {
		return fmt.Errorf("settle image %s: nothing is mounted at %s", name, target)
	}
	dev := mounts[0].Source
	if file, err := loop.BackingFile(dev); err != nil || file != s.Path(name) {
		return fmt.Errorf("settle image %s: %s is mounted at %s, which is not a loop device over %s (%q, %v)", name, dev, target, s.Path(name), file, err)
	}
	if err := loop.ChangeFile(dev, local); err != nil {
		return fmt.Errorf("settle image %s at %s: %w", name, target, err)
	}
	s.Remove(name)
	return nil
}
