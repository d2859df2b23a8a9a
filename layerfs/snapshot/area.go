package snapshot

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/loop"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// DefaultImageBytes is the size of the sparse btrfs image made for
// snapshot caches on a root that is not btrfs: 20 GiB, of which the file
// takes only what the caches use.
const DefaultImageBytes = 20 << 30

// Config places an Area in a store.
type Config struct {
	// Root is the store's root; the area is Root/snapshot (and
	// Root/snapshot.img).
	Root string
	// Tmp is where the image is made before it is renamed into place.
	Tmp string
	// ImageBytes is the image's size; 0 means DefaultImageBytes.
	ImageBytes int64
	// MkfsBtrfs formats the image; "" means "mkfs.btrfs" on PATH.
	MkfsBtrfs string
	// Private is the name of the entry at a volume's root that is the
	// store's, not the build's (its control directory): it never counts
	// as a change.
	Private string
}

// Area is the btrfs area of one store.
type Area struct {
	cfg Config
	// ready caches that Prepare succeeded.
	ready atomic.Bool
}

// New returns the area of a store; it touches nothing on disk.
func New(cfg Config) *Area {
	if cfg.ImageBytes == 0 {
		cfg.ImageBytes = DefaultImageBytes
	}
	if cfg.MkfsBtrfs == "" {
		cfg.MkfsBtrfs = "mkfs.btrfs"
	}
	return &Area{cfg: cfg}
}

// Dir is the area's btrfs directory.
func (a *Area) Dir() string { return filepath.Join(a.cfg.Root, "snapshot") }

// Image is the btrfs image the area lives in when the root is not btrfs.
func (a *Area) Image() string { return filepath.Join(a.cfg.Root, "snapshot.img") }

// GenerationsDir holds the caches' generations; VolumesDir the volumes'
// subvolumes.
func (a *Area) GenerationsDir() string { return filepath.Join(a.Dir(), "generations") }
func (a *Area) VolumesDir() string     { return filepath.Join(a.Dir(), "volumes") }

// GenerationPath is generation id's subvolume; VolumePath volume id's.
func (a *Area) GenerationPath(id string) string { return filepath.Join(a.GenerationsDir(), id) }
func (a *Area) VolumePath(id string) string     { return filepath.Join(a.VolumesDir(), id) }

// Used tells whether snapshot caches were ever used here, so that the
// store brings the area back after a reboot and an overlay-only node
// never needs btrfs.
func (a *Area) Used() bool {
	return ondisk.Exists(a.Image()) || ondisk.Exists(a.GenerationsDir())
}

// Ready tells whether Prepare succeeded and the area is still mounted.
func (a *Area) Ready() bool { return a.ready.Load() && isBtrfs(a.Dir()) }

// Prepare makes the area a btrfs directory with quotas on, creating and
// mounting the image if the root is not on btrfs. Idempotent; the caller
// keeps other processes out (a lock of its own: callers may hold the
// store lock shared).
func (a *Area) Prepare() error {
	if err := a.mount(); err != nil {
		return fmt.Errorf("prepare the btrfs area for snapshot caches at %s: %w", a.Dir(), err)
	}
	for _, dir := range []string{a.GenerationsDir(), a.VolumesDir()} {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	if err := enableQuotas(a.Dir()); err != nil {
		return fmt.Errorf("%w (snapshot caches need btrfs qgroups for their size limits; a kernel without them cannot host this layout)", err)
	}
	a.ready.Store(true)
	return nil
}

// mount makes the area exist on btrfs: a plain directory on a btrfs
// root, else the image's mount (made first if missing).
func (a *Area) mount() error {
	if err := os.Mkdir(a.Dir(), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if isBtrfs(a.cfg.Root) {
		return nil
	}
	mounted, err := mountinfo.Mounted(a.Dir())
	if err != nil {
		return fmt.Errorf("read the mount table: %w", err)
	}
	if mounted {
		if !isBtrfs(a.Dir()) {
			return fmt.Errorf("something other than btrfs (%s) is mounted at %s: unmount it", ondisk.FSTypeName(a.Dir()), a.Dir())
		}
		return nil
	}
	if !ondisk.Exists(a.Image()) {
		if err := a.makeImage(); err != nil {
			return err
		}
	}
	return a.mountImage()
}

// makeImage creates snapshot.img: a sparse file formatted with
// mkfs.btrfs in the store's tmp/, renamed into place once whole, so a
// crash never leaves a half-made image where Prepare would mount it.
func (a *Area) makeImage() (err error) {
	tmp := filepath.Join(a.cfg.Tmp, "new-snapshot.img")
	defer func() {
		if tmp != "" {
			os.Remove(tmp)
		}
	}()
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create btrfs image %s: %w", tmp, err)
	}
	err = f.Truncate(a.cfg.ImageBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("size btrfs image %s to %d bytes: %w", tmp, a.cfg.ImageBytes, err)
	}
	mkfs := a.cfg.MkfsBtrfs
	if out, err := exec.Command(mkfs, "-q", "-f", tmp).CombinedOutput(); err != nil {
		return fmt.Errorf("format the snapshot image with %q -q -f %s: %w: %s (install btrfs-progs, or set the mkfs.btrfs path with --mkfs-btrfs)",
			mkfs, tmp, err, strings.TrimSpace(string(out)))
	}
	if err := ondisk.RenameDurable(tmp, a.Image()); err != nil {
		return fmt.Errorf("move btrfs image into place: %w", err)
	}
	tmp = ""
	return nil
}

// mountImage attaches snapshot.img to a loop device (autoclear) and
// mounts it at the area's directory.
func (a *Area) mountImage() error {
	dev, f, err := loop.Attach(a.Image(), false)
	if err != nil {
		return fmt.Errorf("%w (the snapshot layout on a root that is not btrfs needs loop devices: modprobe loop, and run the agent privileged with /dev)", err)
	}
	defer f.Close() // after the mount holds the device; autoclear frees it at unmount
	// No set-id programs or devices through the area itself; volumes'
	// bind mounts choose their own flags. noatime: reads must not change
	// a volume (see Changed).
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME)
	if err := unix.Mount(dev, a.Dir(), "btrfs", flags, ""); err != nil {
		return fmt.Errorf("mount btrfs image %s (loop device %s) at %s: %w (check that the kernel has btrfs: modprobe btrfs; a damaged image can be moved away, losing the snapshot caches)",
			a.Image(), dev, a.Dir(), err)
	}
	return nil
}
