// Package loop attaches files to loop devices through ioctls, so that
// the node agent's image needs no losetup or mount(8): the snapshot
// layout's btrfs image. (Agents before file-backed lazy mounts also
// mounted layers fetched on demand through loop devices; BackingFile
// recognises what they left.)
package loop

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// major is the loop driver's block device major number.
const major = 7

// attachAttempts bounds the retries when another process takes the
// free loop device between LOOP_CTL_GET_FREE and LOOP_CONFIGURE.
const attachAttempts = 20

// Attach attaches image to a free loop device with autoclear: the device
// frees itself when the last mount of it goes, so an unmount (or a
// reboot) leaves no loop device behind. A read-only device opens image
// read-only. The caller mounts the returned device and closes the
// file; the open file keeps the device until then.
func Attach(image string, readOnly bool) (dev string, f *os.File, err error) {
	mode := os.O_RDWR
	if readOnly {
		mode = os.O_RDONLY
	}
	img, err := os.OpenFile(image, mode|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open image %s: %w", image, err)
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open /dev/loop-control (load the loop module: modprobe loop, and give the agent /dev): %w", err)
	}
	defer ctl.Close()
	for range attachAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev = fmt.Sprintf("/dev/loop%d", n)
		if err := ensureBlockNode(dev, major, uint32(n)); err != nil {
			return "", nil, err
		}
		f, err = configure(dev, img, readOnly)
		if errors.Is(err, unix.EBUSY) {
			time.Sleep(10 * time.Millisecond) // taken meanwhile; ask again
			continue
		}
		if err != nil {
			return "", nil, err
		}
		return dev, f, nil
	}
	return "", nil, fmt.Errorf("attach %s to a loop device: every free device was taken by others %d times in a row", image, attachAttempts)
}

// configure binds img to the loop device dev with LOOP_CONFIGURE (Linux
// 5.8+), or LOOP_SET_FD and LOOP_SET_STATUS64 where that is missing.
func configure(dev string, img *os.File, readOnly bool) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open loop device %s: %w", dev, err)
	}
	cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	if readOnly {
		cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
	}
	copy(cfg.Info.File_name[:], img.Name())
	err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
		err = setLoopFd(f, img, cfg.Info)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("attach %s to loop device %s: %w", img.Name(), dev, err)
	}
	return f, nil
}

func setLoopFd(f, img *os.File, info unix.LoopInfo64) error {
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_FD, int(img.Fd())); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(int(f.Fd()), &info); err != nil {
		unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// ensureBlockNode makes the block device node path (major:minor) if it is
// missing. A container's /dev is a copy made when the container started:
// LOOP_CTL_GET_FREE may hand out a loop device created later (when the
// host's first ones are taken), which the agent's container has no node
// for.
func ensureBlockNode(path string, maj, minor uint32) error {
	var st unix.Stat_t
	err := unix.Stat(path, &st)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == unix.Mkdev(maj, minor):
		return nil
	case err == nil:
		return fmt.Errorf("%s is not block device %d:%d (mode %o, device %d:%d): remove it, or give the agent the host's /dev",
			path, maj, minor, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if err := unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(maj, minor))); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create the node of loop device %s (%d:%d): %w (run the agent privileged)", path, maj, minor, err)
	}
	return nil
}

// BackingFile is the file loop device dev reads, as the kernel names it;
// "" for a device that is free.
func BackingFile(dev string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the backing file of loop device %s: %w", dev, err)
	}
	return strings.TrimSpace(string(b)), nil
}
