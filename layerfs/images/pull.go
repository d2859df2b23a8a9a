package images

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/layercache/layercache/layerfs/erofs"
	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/receive"
)

// Pulled is what Pull brought in.
type Pulled struct {
	Bytes int64 // what the image takes on disk
	Files int64 // its inodes
}

// Pull receives the image that open streams (named name in errors) into
// a temp file under tmpDir, checks it, and moves it in and mounts it as
// layer id. The image is written sparsely (long runs of zeros stay
// holes), so the holes of sparse files take no space on the node. An
// image whose superblock states more than maxBytes (0: no bound) is
// refused before anything else is written.
func (d Dirs) Pull(ctx context.Context, id, tmpDir, name string, open func(context.Context) (io.ReadCloser, error), maxBytes int64) (Pulled, error) {
	f, err := os.CreateTemp(tmpDir, "pull-*.erofs")
	if err != nil {
		return Pulled{}, err
	}
	tmp := f.Name()
	defer func() {
		f.Close()
		if tmp != "" {
			os.Remove(tmp)
		}
	}()
	sb, err := receiveImage(ctx, f, name, open, maxBytes)
	if err != nil {
		return Pulled{}, err
	}
	// The digest proves only that these are the bytes pushed; the kernel
	// must not be the first to read a tenant's metadata.
	if err := erofs.Check(f, sb); err != nil {
		return Pulled{}, fmt.Errorf("layer %s: %w: %w", name, ErrInvalidImage, err)
	}
	if err := f.Sync(); err != nil {
		return Pulled{}, fmt.Errorf("sync the image: %w", err)
	}
	pulled := Pulled{Bytes: receive.Allocated(f), Files: int64(sb.Inodes)}
	if err := ondisk.RenameDurable(tmp, d.Path(id)); err != nil {
		return Pulled{}, fmt.Errorf("move the image into the store: %w", err)
	}
	tmp = ""
	// On failure the image is unreferenced: the store's next sweep
	// removes it and its mount point.
	return pulled, d.Mount(id)
}

// receiveImage streams the fetched image into f, checking its superblock
// against maxBytes before anything else is written and the stream's
// length against the superblock as it goes.
func receiveImage(ctx context.Context, f *os.File, name string, open func(context.Context) (io.ReadCloser, error), maxBytes int64) (erofs.Superblock, error) {
	rc, err := open(ctx)
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
		return sb, fmt.Errorf("layer %s is not a layer image: %w", name, err)
	}
	if maxBytes > 0 && sb.ImageBytes() > maxBytes {
		return sb, fmt.Errorf("layer %s is an image of %d bytes, over the bound of %d: %w", name, sb.ImageBytes(), maxBytes, ErrTooLarge)
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
		return sb, fmt.Errorf("layer %s: the stream has %d bytes, its image's superblock says %d", name, n+erofs.BlockSize, sb.ImageBytes())
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
