package layerfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/containerd/continuity/sysx"
	"github.com/moby/go-archive"
	"golang.org/x/sys/unix"
)

// The OCI layer tar writer that published layers before images. Nodes
// still import such layers (importLayer); the tests make them with it.

// writeLayerTar writes the tree at dir as an OCI layer. Entries come in
// lexical order (WalkDir sorts), with no user or group names and no access
// or change times, so the bytes depend on the layer's content only.
func writeLayerTar(ctx context.Context, dir string, w io.Writer) error {
	lw := &layerWriter{tw: tar.NewWriter(w), dir: dir, links: map[uint64]string{}, buf: make([]byte, 256<<10)}
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == dir {
			return nil // the layer's root is the volume's root, not content
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		return lw.add(p, rel)
	})
	if err != nil {
		return err
	}
	return lw.tw.Close()
}

type layerWriter struct {
	tw    *tar.Writer
	dir   string
	links map[uint64]string // inode -> first name, for hardlinks
	buf   []byte            // one copy buffer for every file
}

func (lw *layerWriter) add(p, rel string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Mode&syscall.S_IFMT == syscall.S_IFCHR && st.Rdev == 0 {
		// Checked before hardlinks: the kernel shares one inode among
		// many whiteouts.
		return lw.whiteout(rel)
	}
	hdr, err := lw.header(p, rel, fi)
	if err != nil {
		return err
	}
	if fi.Mode().IsRegular() && st.Nlink > 1 {
		if first, ok := lw.links[st.Ino]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
		} else {
			lw.links[st.Ino] = hdr.Name
		}
	}
	if err := lw.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
		if err := copyContent(lw.tw, p, hdr.Size, lw.buf); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	if fi.IsDir() {
		return lw.opaqueMarker(p, hdr)
	}
	return nil
}

// header builds an entry's header: go-archive's canonical one, with the
// mtime at full precision (build tools compare them) and the xattrs.
func (lw *layerWriter) header(p, rel string, fi os.FileInfo) (*tar.Header, error) {
	var link string
	if fi.Mode()&os.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return nil, err
		}
	}
	hdr, err := archive.FileInfoHeader(rel, fi, link)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	hdr.ModTime = fi.ModTime()
	xattrs, err := contentXattrs(p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	for k, v := range xattrs {
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords[paxXattr+k] = v
	}
	return hdr, nil
}

// whiteout writes an overlay whiteout as the OCI .wh.<name> file. Its
// time and owner are fixed: they mean nothing, and a node that pulled the
// layer gets new ones from mknod, yet must export the same bytes.
func (lw *layerWriter) whiteout(rel string) error {
	dir, name := path.Split(filepath.ToSlash(rel))
	return lw.tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: dir + archive.WhiteoutPrefix + name,
		Mode: 0o600, ModTime: time.Unix(0, 0), Format: tar.FormatPAX,
	})
}

// opaqueMarker writes .wh..wh..opq into an opaque directory, right after
// the directory, so that an importer marks it before creating its entries.
func (lw *layerWriter) opaqueMarker(p string, dirHdr *tar.Header) error {
	v, err := sysx.LGetxattr(p, overlayOpaqueXattr)
	if errors.Is(err, unix.ENODATA) || (err == nil && string(v) != "y") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: read %s: %w", dirHdr.Name, overlayOpaqueXattr, err)
	}
	return lw.tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: dirHdr.Name + archive.WhiteoutOpaqueDir,
		Mode: dirHdr.Mode & 0o777, Uid: dirHdr.Uid, Gid: dirHdr.Gid,
		ModTime: dirHdr.ModTime, Format: tar.FormatPAX,
	})
}

// contentXattrs reads an entry's xattrs except overlay's own (opaque,
// origin, impure...), which describe this node's stack, not content.
func contentXattrs(p string) (map[string]string, error) {
	keys, err := sysx.LListxattr(p)
	if err != nil {
		return nil, fmt.Errorf("list xattrs: %w", err)
	}
	slices.Sort(keys)
	xattrs := map[string]string{}
	for _, k := range keys {
		if isOverlayXattr(k) {
			continue
		}
		v, err := sysx.LGetxattr(p, k)
		if err != nil {
			return nil, fmt.Errorf("read xattr %s: %w", k, err)
		}
		xattrs[k] = string(v)
	}
	return xattrs, nil
}

// copyContent writes exactly size bytes of file p: a layer is immutable,
// so a different length means the store is damaged, and the tar must not
// be published.
func copyContent(w io.Writer, p string, size int64, buf []byte) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyBuffer(w, io.LimitReader(f, size), buf)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("read %d of its %d bytes: the layer changed or is damaged", n, size)
	}
	return nil
}
