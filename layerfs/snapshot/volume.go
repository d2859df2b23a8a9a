package snapshot

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Root is the owner and mode a volume's root shows, whatever its
// cache's root was (as an overlay volume's root shows its upper
// directory's).
type Root struct {
	UID, GID int
	Mode     os.FileMode
}

// Subvolume is what the store records of a volume's subvolume, as
// fields of the volume's record.
type Subvolume struct {
	// SubvolID is the subvolume's (and its qgroup's) id.
	SubvolID uint64 `json:"subvolID,omitempty"`
	// RootDigest is what the volume's root listed when it was made, to
	// tell a build's changes from none (Changed).
	RootDigest string `json:"rootDigest,omitempty"`
}

// MakeVolume makes volume id's writable subvolume from generation from
// (empty if from is ""), after deleting what a crashed attempt left,
// gives its root owner and mode root and, if limit > 0, limits it to
// limit bytes.
func (a *Area) MakeVolume(id, from string, root Root, limit int64) (Subvolume, error) {
	path := a.VolumePath(id)
	if err := deleteSubvolume(path); err != nil { // a crashed attempt's
		return Subvolume{}, err
	}
	if from != "" {
		if err := snapshotSubvolume(a.GenerationPath(from), path, false); err != nil {
			return Subvolume{}, err
		}
	} else if err := makeEmptySubvolume(path); err != nil {
		return Subvolume{}, err
	}
	if err := os.Chown(path, root.UID, root.GID); err != nil {
		return Subvolume{}, err
	}
	if err := os.Chmod(path, root.Mode); err != nil {
		return Subvolume{}, err
	}
	subvol, err := subvolumeID(path)
	if err != nil {
		return Subvolume{}, err
	}
	if limit > 0 {
		if err := a.limitVolume(subvol, limit); err != nil {
			return Subvolume{}, err
		}
	}
	digest, err := a.rootDigest(path)
	if err != nil {
		return Subvolume{}, err
	}
	return Subvolume{SubvolID: subvol, RootDigest: digest}, nil
}

// limitVolume sets the size limit of the volume whose subvolume is id.
// With simple quotas it bounds the volume's qgroup (volumeQgroup), which
// the subvolumes a build nests in it join; full qgroups would have to
// rescan to account a snapshot under a new parent and add nested
// subvolumes to none, so there the limit stays on the subvolume's own
// qgroup (kernels before 6.7, where a nested subvolume escapes it).
func (a *Area) limitVolume(id uint64, bytes int64) error {
	dir := a.Dir()
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
	// the subvolume's birth (Changed tells changes by that).
	return ondisk.SyncFS(path)
}

// HasVolume tells whether volume id's subvolume exists (a crash may have
// undone its creation).
func (a *Area) HasVolume(id string) bool { return isSubvolume(a.VolumePath(id)) }

// DeleteVolume deletes volume id's subvolume; a missing one is no error.
func (a *Area) DeleteVolume(id string) error { return deleteSubvolume(a.VolumePath(id)) }

// DeleteGeneration deletes generation id; a missing one is no error.
func (a *Area) DeleteGeneration(id string) error { return deleteSubvolume(a.GenerationPath(id)) }

// MountFlags lift a volume mount's restrictions (nosuid, nodev).
type MountFlags struct{ AllowSetuid, AllowDevices bool }

// bindFlags are the flags of a volume's bind mount: nosuid and nodev
// unless lifted (the same rules as overlay volumes), and noatime, so that
// reading a cache does not count as changing it (Changed).
func (f MountFlags) bindFlags() (flags uintptr, names []string) {
	flags, names = unix.MS_NOATIME, []string{"noatime"}
	if !f.AllowSetuid {
		flags, names = flags|unix.MS_NOSUID, append(names, "nosuid")
	}
	if !f.AllowDevices {
		flags, names = flags|unix.MS_NODEV, append(names, "nodev")
	}
	return flags, names
}

// Mount bind-mounts volume id's subvolume at target. A bind mount takes
// its flags only from a remount.
func (a *Area) Mount(id, target string, f MountFlags) error {
	src := a.VolumePath(id)
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s at %s: %w", src, target, err)
	}
	flags, _ := f.bindFlags()
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		ondisk.Unmount(target)
		return fmt.Errorf("restrict the bind mount at %s: %w", target, err)
	}
	return nil
}

// MountCommand is the mount(8) equivalent of Mount, for debugging.
func (a *Area) MountCommand(id, target string, f MountFlags) string {
	_, names := f.bindFlags()
	return fmt.Sprintf("mount --bind %s %s && mount -o remount,bind,%s %s", a.VolumePath(id), target, strings.Join(names, ","), target)
}
