// Package images keeps the layers a node pulled: each is an EROFS image
// (layerfs/erofs) kept whole under the store's images/<id> and mounted
// read-only at layers/<id>, where every other part of the store finds a
// layer. A pull is fetch, verify and mount, with no per-file work and
// nothing translated. The image is the layer's content; its mount is
// derived state that the store's Recover restores after a reboot, and
// its sweep undoes before it removes the layer. The store decides which
// layers exist and holds the locks; this package only reads, writes and
// mounts the images it is told about.
package images

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// ErrTooLarge is returned (wrapped) by Pull for an image larger than its
// bound.
var ErrTooLarge = errors.New("layer too large")

// ErrInvalidImage is returned (wrapped) by Pull for an image that is not
// one this store writes (erofs.Check: an inode, directory or xattr out of
// bounds, a cycle, overlayfs's own xattrs): it is never mounted.
var ErrInvalidImage = errors.New("invalid layer image")

// mountFlags: a layer's image holds whatever a build wrote; its mount
// never runs set-id programs or opens devices (the volume's overlay has
// its own flags for what a build sees).
const mountFlags = unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID

// Dirs are where a store keeps layer images and mounts them.
type Dirs struct {
	Images string // the images, by layer id
	Layers string // the layers' directories, each image's mount point
}

// Path is layer id's image.
func (d Dirs) Path(id string) string { return filepath.Join(d.Images, id) }

// Has tells whether layer id is kept as an image.
func (d Dirs) Has(id string) bool { return ondisk.Exists(d.Path(id)) }

// Mount mounts layer id's image at its layer directory, unless it is
// mounted already. The kernel reads the image file directly (EROFS
// file-backed mounts, Linux 6.12+): no loop device.
func (d Dirs) Mount(id string) error {
	dir := filepath.Join(d.Layers, id)
	if ondisk.IsMountPoint(dir) {
		return nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create mount point of layer %s: %w", id, err)
	}
	if err := unix.Mount(d.Path(id), dir, "erofs", mountFlags, ""); err != nil {
		return fmt.Errorf("mount -t erofs -o ro,nodev,nosuid %s %s (the kernel needs EROFS with file-backed mounts, CONFIG_EROFS_FS_BACKED_BY_FILE, Linux 6.12+): %w", d.Path(id), dir, err)
	}
	return nil
}

// MountOver mounts layer id's image at its layer directory even when
// something is mounted there already (a settled lazy layer's loop
// device, which volumes mounted before keep reading): the file-backed
// mount stacked over it serves the volumes mounted from then on.
func (d Dirs) MountOver(id string) error {
	dir := filepath.Join(d.Layers, id)
	if err := unix.Mount(d.Path(id), dir, "erofs", mountFlags, ""); err != nil {
		return fmt.Errorf("mount -t erofs -o ro,nodev,nosuid %s %s: %w", d.Path(id), dir, err)
	}
	return nil
}

// Ready mounts the images of the layers ids that are kept as images,
// before an overlay stacks them: an overlay over an image layer's empty
// mount point would show a cache without that layer. Mounts are gone
// after a reboot, and the CLI may run before the agent's Recover.
func (d Dirs) Ready(ids []string) error {
	for _, id := range ids {
		if d.Has(id) {
			if err := d.Mount(id); err != nil {
				return err
			}
		}
	}
	return nil
}

// Remount mounts the image of every layer of refs whose mount is gone (a
// reboot).
func (d Dirs) Remount(refs map[string]bool) error {
	entries, err := os.ReadDir(d.Images)
	if err != nil {
		return fmt.Errorf("list layer images: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if refs[e.Name()] {
			errs = append(errs, d.Mount(e.Name()))
		}
	}
	return errors.Join(errs...)
}
