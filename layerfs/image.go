package layerfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/erofs"
	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/receive"
)

// A pulled layer is an EROFS image (layerfs/erofs) kept whole under
// images/<id> and mounted read-only at layers/<id>, where every other part
// of the store finds a layer: a pull is fetch, verify and mount, with no
// per-file work and nothing translated. The image is the layer's content;
// its mount is derived state that Recover restores after a reboot, and
// the sweep undoes before it removes the layer.

func (s *Store) imagesDir() string          { return filepath.Join(s.root, "images") }
func (s *Store) imagePath(id string) string { return filepath.Join(s.imagesDir(), id) }

// imageMountFlags: a layer's image holds whatever a build wrote; its mount
// never runs set-id programs or opens devices (the volume's overlay has
// its own flags for what a build sees).
const imageMountFlags = unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID

// mountImage mounts layer id's image at its layer directory, unless it is
// mounted already. The kernel reads the image file directly (EROFS
// file-backed mounts, Linux 6.12+): no loop device.
func (s *Store) mountImage(id string) error {
	dir := s.layerDir(id)
	if ondisk.IsMountPoint(dir) {
		return nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create mount point of layer %s: %w", id, err)
	}
	if err := unix.Mount(s.imagePath(id), dir, "erofs", imageMountFlags, ""); err != nil {
		return fmt.Errorf("mount -t erofs -o ro,nodev,nosuid %s %s (the kernel needs EROFS with file-backed mounts, CONFIG_EROFS_FS_BACKED_BY_FILE, Linux 6.12+): %w", s.imagePath(id), dir, err)
	}
	return nil
}

// isImageLayer tells whether layer id is kept as an image.
func (s *Store) isImageLayer(id string) bool { return ondisk.Exists(s.imagePath(id)) }

// readyLayers mounts the images of the layers ids that are kept as
// images, before an overlay stacks them: an overlay over an image layer's
// empty mount point would show a cache without that layer. Mounts are
// gone after a reboot, and the CLI may run before the agent's Recover.
func (s *Store) readyLayers(ids []string) error {
	for _, id := range ids {
		if s.isImageLayer(id) {
			if err := s.mountImage(id); err != nil {
				return err
			}
		}
	}
	return nil
}

// remountImages mounts the image of every layer a head references whose
// mount is gone (a reboot), so that the node's layers are all in place
// before the agent serves.
func (s *Store) remountImages(ctx context.Context) error {
	l, err := s.lockStore(ctx, true)
	if err != nil {
		return err
	}
	defer l.Unlock()
	refs, err := s.referencedLayers()
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(s.imagesDir())
	if err != nil {
		return fmt.Errorf("list layer images: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if refs[e.Name()] {
			errs = append(errs, s.mountImage(e.Name()))
		}
	}
	return errors.Join(errs...)
}

// pullImage fetches a chain layer's image into images/ and mounts it as a
// new layer. The image is written sparsely (long runs of zeros stay
// holes), so the holes of sparse files take no space on the node.
func (s *Store) pullImage(ctx context.Context, cl ChainLayer, fetch Fetch, maxBytes int64) (layer LayerInfo, err error) {
	f, err := os.CreateTemp(s.tmpDir(), "pull-*.erofs")
	if err != nil {
		return layer, err
	}
	tmp := f.Name()
	defer func() {
		f.Close()
		if tmp != "" {
			os.Remove(tmp)
		}
	}()
	sb, err := receiveImage(ctx, f, cl, fetch, maxBytes)
	if err != nil {
		return layer, err
	}
	// The digest proves only that these are the bytes pushed; the kernel
	// must not be the first to read a tenant's metadata.
	if err := erofs.Check(f, sb); err != nil {
		return layer, fmt.Errorf("layer %s: %w: %w", cl.Digest, ErrInvalidImage, err)
	}
	if err := f.Sync(); err != nil {
		return layer, fmt.Errorf("sync the image: %w", err)
	}
	layer = LayerInfo{ID: randomID(), Bytes: receive.Allocated(f), Files: int64(sb.Inodes), Created: time.Now().UTC(), Digest: cl.Digest}
	if err := ondisk.RenameDurable(tmp, s.imagePath(layer.ID)); err != nil {
		return layer, fmt.Errorf("move the image into the store: %w", err)
	}
	tmp = ""
	if err := s.mountImage(layer.ID); err != nil {
		// Unreferenced: the next sweep removes the image and its mount point.
		return layer, err
	}
	return layer, nil
}

// receiveImage streams the fetched image into f, checking its superblock
// against maxBytes before anything else is written and the stream's
// length against the superblock as it goes.
func receiveImage(ctx context.Context, f *os.File, cl ChainLayer, fetch Fetch, maxBytes int64) (erofs.Superblock, error) {
	rc, err := fetch(ctx, cl)
	if err != nil {
		return erofs.Superblock{}, fmt.Errorf("fetch: %w", err)
	}
	defer func() {
		if rc != nil {
			rc.Close()
		}
	}()
	r := receive.WithContext(ctx, rc)
	first := make([]byte, erofs.BlockSize)
	if _, err := io.ReadFull(r, first); err != nil {
		return erofs.Superblock{}, fmt.Errorf("read the image's first block: %w", err)
	}
	ondisk.FaultPoint()
	sb, err := erofs.ParseSuperblock(first)
	if err != nil {
		return sb, fmt.Errorf("layer %s is not a layer image: %w", cl.Digest, err)
	}
	if maxBytes > 0 && sb.ImageBytes() > maxBytes {
		return sb, fmt.Errorf("layer %s is an image of %d bytes, over the bound of %d: %w", cl.Digest, sb.ImageBytes(), maxBytes, ErrTooLarge)
	}
	if _, err := f.Write(first); err != nil {
		return sb, fmt.Errorf("write the image: %w", err)
	}
	sw := receive.NewSparseWriter(f, erofs.BlockSize)
	// One byte past the image tells a stream longer than its superblock.
	n, err := receive.CopyPipelined(sw, io.LimitReader(r, sb.ImageBytes()-erofs.BlockSize+1), 1<<20, 4)
	if err != nil {
		return sb, fmt.Errorf("receive the image: %w", err)
	}
	if n+erofs.BlockSize != sb.ImageBytes() {
		return sb, fmt.Errorf("layer %s: the stream has %d bytes, its image's superblock says %d", cl.Digest, n+erofs.BlockSize, sb.ImageBytes())
	}
	if err := sw.Finish(); err != nil {
		return sb, err
	}
	// The digest is checked at the end of the stream: read it to its end
	// and close it before the image counts.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return sb, fmt.Errorf("read to the end: %w", err)
	}
	err = rc.Close()
	rc = nil
	if err != nil {
		return sb, fmt.Errorf("fetch: %w", err)
	}
	return sb, nil
}
