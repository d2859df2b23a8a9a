package layerfs

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/moby/go-archive"

	"github.com/layercache/layercache/layerfs/erofs"
)

// A layer published as a tar (FormatTar) is unpacked into a new layer
// directory, without the overlay xattrs a tar could smuggle in.

// pullTar unpacks a layer published as a tar into a temp dir under tmp/,
// syncs it and renames it into layers/ under a new id.
func (s *Store) pullTar(ctx context.Context, cl ChainLayer, fetch Fetch, maxBytes int64) (layer LayerInfo, err error) {
	tmp, err := os.MkdirTemp(s.tmpDir(), "pull-")
	if err != nil {
		return layer, err
	}
	defer func() {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
	}()
	if err := importLayer(ctx, tmp, cl, fetch, maxBytes); err != nil {
		return layer, err
	}
	if err := syncFS(tmp); err != nil {
		return layer, err
	}
	bytes, files, err := diskUsage(tmp)
	if err != nil {
		return layer, err
	}
	layer = LayerInfo{ID: randomID(), Bytes: bytes, Files: files, Created: time.Now().UTC(), Digest: cl.Digest}
	if err := renameDurable(tmp, s.layerDir(layer.ID)); err != nil {
		return layer, fmt.Errorf("move it into the store: %w", err)
	}
	tmp = ""
	return layer, nil
}

// importLayer unpacks the layer's tar into dir with go-archive, which
// turns OCI whiteouts into overlay ones and refuses entries that would
// land outside dir. The stream is read to its end, so that the fetcher
// sees every byte and can check the digest. Tars are what layers were
// published as before images; their files are written dense, so bounding
// the tar's bytes bounds what it takes on disk.
func importLayer(ctx context.Context, dir string, cl ChainLayer, fetch Fetch, maxBytes int64) error {
	rc, err := fetch(ctx, cl)
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	defer func() {
		if rc != nil {
			rc.Close() // after a failure; the error that counts is returned
		}
	}()
	br := bufio.NewReaderSize(&ctxReader{ctx: ctx, r: rc}, erofs.BlockSize)
	if first, _ := br.Peek(erofs.BlockSize); len(first) == erofs.BlockSize {
		if _, err := erofs.ParseSuperblock(first); err == nil {
			// A tar reader takes the image's leading zeros for the end of
			// an empty archive: the layer would arrive empty.
			return fmt.Errorf("layer %s is an image, but its chain says it is a tar", cl.Digest)
		}
	}
	var r io.Reader = br
	if maxBytes > 0 {
		r = &boundReader{r: r, left: maxBytes, what: "layer " + cl.Digest}
	}
	filtered := withoutOverlayXattrs(r)
	defer filtered.Close()
	faultPoint()
	if err := archive.Unpack(filtered, dir, &archive.TarOptions{WhiteoutFormat: archive.OverlayWhiteoutFormat}); err != nil {
		// go-archive's refusals (an entry or link leaving the layer's
		// directory) name the entry; the head is not touched either way.
		return fmt.Errorf("unpack its tar (the cache is unchanged): %w", err)
	}
	// Unpack stops at the end-of-archive marker: read the rest, through
	// the filter and then raw.
	if _, err := io.Copy(io.Discard, filtered); err != nil {
		return fmt.Errorf("read to the end: %w", err)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("read to the end: %w", err)
	}
	err = rc.Close()
	rc = nil
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	// The temp dir was made 0700; the layer's root is never a volume's
	// root (the upper layer's is), but squash views show it.
	return os.Chmod(dir, 0o755)
}

// boundReader fails a stream once it passes its bound.
type boundReader struct {
	r    io.Reader
	left int64
	what string
}

func (b *boundReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n, fmt.Errorf("%s unpacks to more than its bound: %w", b.what, ErrTooLarge)
	}
	return n, err
}

const overlayOpaqueXattr = "trusted.overlay.opaque"

// paxXattr prefixes an xattr's name in a tar header's PAX records.
const paxXattr = "SCHILY.xattr."

// isOverlayXattr tells overlay's own xattrs (opaque, origin, impure,
// redirect...): they describe a node's layer stack, not content.
func isOverlayXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
}

// ctxReader stops a stream once ctx is done: Unpack takes no context.
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

// withoutOverlayXattrs passes a tar through without overlay's own xattrs
// (trusted.overlay.*, user.overlay.*). A layer this store exported has
// none, but a blob someone else pushed could carry redirects or origins
// that make the kernel look elsewhere in the node's layer stack.
func withoutOverlayXattrs(r io.Reader) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(copyTarWithoutOverlayXattrs(r, pw)) }()
	return pr
}

func copyTarWithoutOverlayXattrs(r io.Reader, w io.Writer) error {
	// Buffered, so that the pipe hands over large chunks rather than
	// every header and small file on its own.
	bw := bufio.NewWriterSize(w, 256<<10)
	tr, tw := tar.NewReader(r), tar.NewWriter(bw)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			if err := tw.Close(); err != nil {
				return err
			}
			return bw.Flush()
		}
		if err != nil {
			return err
		}
		for k := range hdr.PAXRecords {
			if x, ok := strings.CutPrefix(k, paxXattr); ok && isOverlayXattr(x) {
				delete(hdr.PAXRecords, k)
			}
		}
		for k := range hdr.Xattrs { //nolint:staticcheck // the reader fills both
			if isOverlayXattr(k) {
				delete(hdr.Xattrs, k) //nolint:staticcheck
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
}
