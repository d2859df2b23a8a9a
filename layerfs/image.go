package layerfs

import (
	"bytes"
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
	layer = LayerInfo{ID: randomID(), Bytes: allocated(f), Files: int64(sb.Inodes), Created: time.Now().UTC(), Digest: cl.Digest}
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
	r := &ctxReader{ctx: ctx, r: rc}
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
	sw := &sparseWriter{f: f, off: erofs.BlockSize}
	// One byte past the image tells a stream longer than its superblock.
	n, err := copyPipelined(sw, io.LimitReader(r, sb.ImageBytes()-erofs.BlockSize+1), 1<<20, 4)
	if err != nil {
		return sb, fmt.Errorf("receive the image: %w", err)
	}
	if n+erofs.BlockSize != sb.ImageBytes() {
		return sb, fmt.Errorf("layer %s: the stream has %d bytes, its image's superblock says %d", cl.Digest, n+erofs.BlockSize, sb.ImageBytes())
	}
	if err := sw.finish(); err != nil {
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

// ctxReader stops a stream once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// sparseWriter writes a stream to f at increasing offsets, leaving runs
// of zeros of holeMin or more as holes: the holes of a sparse file take
// no space on the node, and shorter runs (padding, zeros inside a file's
// data) are written, as a hole for each of them would split the image
// into thousands of small extents that the disk writes slower than the
// zeros (make bench: 1.3x).
type sparseWriter struct {
	f       *os.File
	off     int64
	pending []byte // a partial block carried to the next Write
	kicked  int64  // where the last startWriteback ended
}

const holeMin = 64 << 10

var zeroBlock = make([]byte, erofs.BlockSize)

func (w *sparseWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(w.pending) > 0 {
		take := min(erofs.BlockSize-len(w.pending), len(p))
		w.pending = append(w.pending, p[:take]...)
		p = p[take:]
		if len(w.pending) < erofs.BlockSize {
			return n, nil
		}
		if err := w.writeBlocks(w.pending); err != nil {
			return 0, err
		}
		w.pending = w.pending[:0]
	}
	whole := len(p) / erofs.BlockSize * erofs.BlockSize
	if err := w.writeBlocks(p[:whole]); err != nil {
		return 0, err
	}
	w.pending = append(w.pending, p[whole:]...)
	return n, nil
}

// writeBlocks writes p, whole blocks, with one pwrite per stretch between
// long runs of zeros.
func (w *sparseWriter) writeBlocks(p []byte) error {
	start := 0
	for i := 0; i < len(p); {
		zeros := zeroRun(p[i:])
		if zeros < holeMin {
			i += max(zeros, erofs.BlockSize)
			continue
		}
		if _, err := w.f.WriteAt(p[start:i], w.off+int64(start)); err != nil {
			return err
		}
		i += zeros
		start = i
	}
	if _, err := w.f.WriteAt(p[start:], w.off+int64(start)); err != nil {
		return err
	}
	w.off += int64(len(p))
	w.startWriteback()
	return nil
}

// zeroRun is the length of the all-zero blocks p starts with.
func zeroRun(p []byte) int {
	n := 0
	for n < len(p) && bytes.Equal(p[n:n+erofs.BlockSize], zeroBlock) {
		n += erofs.BlockSize
	}
	return n
}

// writebackStep is how much written data a sparseWriter lets pile up in
// the page cache before it starts writing it to disk.
const writebackStep = 8 << 20

// startWriteback starts (without waiting for) the disk writes of what
// was written since the last call, once there is writebackStep of it, so
// they overlap the download and the final fsync has little left to do.
// It is a hint: an error of the writes shows at the fsync.
func (w *sparseWriter) startWriteback() {
	if w.off-w.kicked < writebackStep {
		return
	}
	_ = unix.SyncFileRange(int(w.f.Fd()), w.kicked, w.off-w.kicked, unix.SYNC_FILE_RANGE_WRITE)
	w.kicked = w.off
}

// finish writes what is left and sets the file's length, so trailing
// holes count.
func (w *sparseWriter) finish() error {
	if len(w.pending) > 0 {
		if _, err := w.f.WriteAt(w.pending, w.off); err != nil {
			return err
		}
		w.off += int64(len(w.pending))
	}
	return w.f.Truncate(w.off)
}

// allocated is what f takes on disk.
func allocated(f *os.File) int64 {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return 0
	}
	return st.Blocks * 512
}
