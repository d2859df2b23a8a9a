package layerfs

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
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

// A blob that is not a layer this store wrote must not write outside the
// layer's directory.
func TestSyncRefusesTarsThatEscape(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []tar.Header
		wantErr string // empty: the tar is harmless and imports
	}{
		{"dot-dot entry", []tar.Header{{Name: "../evil", Typeflag: tar.TypeReg}}, "invalid entry name"},
		{"deep dot-dot entry", []tar.Header{{Name: "a/../../../evil", Typeflag: tar.TypeReg}}, "invalid entry name"},
		{"hardlink out", []tar.Header{{Name: "l", Typeflag: tar.TypeLink, Linkname: "../../evil"}}, "invalid hardlink target"},
		{"through a relative symlink", []tar.Header{
			{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../.."},
			{Name: "up/evil", Typeflag: tar.TypeReg},
		}, "escapes"},
		{"whiteout of a parent", []tar.Header{{Name: ".wh..", Typeflag: tar.TypeReg}}, "invalid whiteout"},
		// An absolute symlink resolves inside the layer, as in a chroot.
		{"through an absolute symlink", []tar.Header{
			{Name: "abs", Typeflag: tar.TypeSymlink, Linkname: "/"},
			{Name: "abs/evil", Typeflag: tar.TypeReg},
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			s := newTestStore(t, Options{Root: filepath.Join(parent, "store")})
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tc.entries {
				h.Mode = 0o644
				must(t, tw.WriteHeader(&h))
			}
			must(t, tw.Close())
			reg := registry{}
			chain := Chain{Generation: 1, Layers: []ChainLayer{{Digest: reg.put(buf.Bytes())}}}
			_, err := s.Sync(context.Background(), mustRef(t, "ns/c"), chain, reg.fetch, SyncOptions{})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Sync: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Sync = %v, want an error containing %q", err, tc.wantErr)
			}
			t.Log(err)
			must(t, filepath.Walk(parent, func(p string, _ os.FileInfo, err error) error {
				if err == nil && filepath.Base(p) == "evil" && !strings.HasPrefix(p, s.layersDir()) {
					t.Errorf("the tar wrote %s", p)
				}
				return err
			}))
			assertMissing(t, "/evil")
			_, err = s.Recover(context.Background())
			must(t, err)
			assertNoOrphans(t, s)
		})
	}
}

// syncCrashFixture is a published three-layer chain, built once: the
// crash test needs it for every crash point.
var syncCrashFixture struct {
	chain Chain
	reg   registry
}

func syncFixture(t testing.TB) (Chain, registry) {
	if syncCrashFixture.reg == nil {
		src := newTestStore(t, Options{})
		buildChain(t, src, "ns/c", layerSteps)
		syncCrashFixture.reg = registry{}
		syncCrashFixture.chain = publish(t, src, syncCrashFixture.reg, "ns/c")
	}
	return syncCrashFixture.chain, syncCrashFixture.reg
}

// blobDir is where the crash test keeps a store's registry: the crash
// child reads it from there.
func blobDir(s *Store) string { return s.Root() + "-blobs" }

// setupSyncCrash gives s the chain's bottom layer and an unpublished
// commit on top, and writes the registry for the child.
func setupSyncCrash(t testing.TB, s *Store) {
	chain, reg := syncFixture(t)
	must(t, os.Mkdir(blobDir(s), 0o700))
	for d, data := range reg {
		must(t, os.WriteFile(filepath.Join(blobDir(s), strings.TrimPrefix(d, "sha256:")), data, 0o600))
	}
	data, err := json.Marshal(chain)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(blobDir(s), "chain.json"), data, 0o600))
	bottom := Chain{Generation: 1, Layers: chain.Layers[2:]}
	mustSync(t, s, "ns/c", bottom, reg.fetch)
	commitFiles(t, s, "ns/c", map[string]string{"local": "unpublished", "keep.txt": "local"})
}

// runSyncCrash syncs the whole chain from blobDir, one layer at a time so
// that the crash points come in a fixed order.
func runSyncCrash(ctx context.Context, s *Store) error {
	var chain Chain
	data, err := os.ReadFile(filepath.Join(blobDir(s), "chain.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &chain); err != nil {
		return err
	}
	fetch := func(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
		return os.Open(filepath.Join(blobDir(s), strings.TrimPrefix(l.Digest, "sha256:")))
	}
	_, err = s.Sync(ctx, CacheRef{"ns", "c"}, chain, fetch, SyncOptions{Parallel: 1})
	return err
}

// Overlay's own xattrs in a blob (a redirect, an origin) would make the
// kernel look elsewhere in the node's stack: they are dropped, others kept.
func TestSyncDropsOverlayXattrs(t *testing.T) {
	s := newTestStore(t, Options{})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	must(t, tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, PAXRecords: map[string]string{
		paxXattr + "trusted.overlay.redirect": "/elsewhere",
		paxXattr + "user.overlay.origin":      "x",
		paxXattr + "user.kept":                "yes",
	}}))
	must(t, tw.Close())
	reg := registry{}
	chain := Chain{Generation: 1, Layers: []ChainLayer{{Digest: reg.put(buf.Bytes())}}}
	mustSync(t, s, "ns/c", chain, reg.fetch)
	dir := filepath.Join(s.layerDir(headIDs(t, s, "ns/c")[0]), "d")
	xattrs, err := contentXattrs(dir)
	must(t, err)
	keys, err := sysx.LListxattr(dir)
	must(t, err)
	if len(keys) != 1 || xattrs["user.kept"] != "yes" {
		t.Fatalf("imported xattrs %v, want only user.kept", keys)
	}
}
