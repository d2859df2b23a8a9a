package volumes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// The mount gate keeps a claim's pod from starting on its volume's bare
// mount point. A claim's PV is a hostPath, which the kubelet hands to the
// container as it finds it. After a reboot the volume's overlay is gone
// and its mount point is an empty directory until the agent's startup
// mounts it again; the new kubelet, which starts before the agent, would
// start the pods waiting to start on that directory (a non-root build
// fails, a root build writes beside the volume). So the PV points at a
// symlink ROOT/run/<pv> to the mount point, on a tmpfs the agent mounts:
// a reboot takes the tmpfs and the link away, the kubelet's hostPath
// check (type Directory) fails and is retried, and the agent makes the
// link again once the volume is mounted (remount).
const GateDir = "run"

// gatePath is the PV's path through the gate of the store at root.
func gatePath(root, pv string) string { return filepath.Join(root, GateDir, pv) }

// mountGate mounts the gate's tmpfs below the store at root, unless it is
// mounted (an agent restart without a reboot).
func mountGate(root string) error {
	dir := filepath.Join(root, GateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mount gate: %w", err)
	}
	mounted, err := mountinfo.Mounted(dir)
	if err != nil {
		return fmt.Errorf("mount gate %s: %w", dir, err)
	}
	if mounted {
		return nil
	}
	if err := unix.Mount("layercache-gate", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		return fmt.Errorf("mount gate tmpfs on %s: %w", dir, err)
	}
	return nil
}

// openGate links the PV's gate path to its volume's mount point.
func openGate(root, pv, mountPoint string) error {
	link := gatePath(root, pv)
	if target, err := os.Readlink(link); err == nil && target == mountPoint {
		return nil
	}
	// Made by mountGate at the agent's start; a store the agent did not
	// start on (tests) gets the directory without the tmpfs.
	if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
		return fmt.Errorf("open gate of PV %s: %w", pv, err)
	}
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("open gate of PV %s: %w", pv, err)
	}
	if err := os.Symlink(mountPoint, link); err != nil {
		return fmt.Errorf("open gate of PV %s: %w", pv, err)
	}
	return nil
}

// closeGate removes the PV's link once its volume has ended.
func closeGate(root, pv string) error {
	if err := os.Remove(gatePath(root, pv)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("close gate of PV %s: %w", pv, err)
	}
	return nil
}
