package layerfs

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Loop devices through ioctls, so that the node agent's image needs no
// losetup or mount(8).

// loopAttachAttempts bounds the retries when another process takes the
// free loop device between LOOP_CTL_GET_FREE and LOOP_CONFIGURE.
const loopAttachAttempts = 20

// attachLoop attaches image to a free loop device with autoclear: the
// device frees itself when the last mount of it goes, so an unmount (or a
// reboot) leaves no loop device behind. The caller mounts the returned
// device and closes the file; the open file keeps the device until then.
func attachLoop(image string) (dev string, f *os.File, err error) {
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open btrfs image %s: %w", image, err)
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open /dev/loop-control (load the loop module: modprobe loop, and give the agent /dev): %w", err)
	}
	defer ctl.Close()
	for range loopAttachAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev = fmt.Sprintf("/dev/loop%d", n)
		f, err = configureLoop(dev, img)
		if errors.Is(err, unix.EBUSY) {
			time.Sleep(10 * time.Millisecond) // taken meanwhile; ask again
			continue
		}
		if err != nil {
			return "", nil, err
		}
		return dev, f, nil
	}
	return "", nil, fmt.Errorf("attach %s to a loop device: every free device was taken by others %d times in a row", image, loopAttachAttempts)
}

// configureLoop binds img to the loop device dev with LOOP_CONFIGURE
// (Linux 5.8+), or LOOP_SET_FD and LOOP_SET_STATUS64 where that is missing.
func configureLoop(dev string, img *os.File) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open loop device %s: %w", dev, err)
	}
	cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
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
