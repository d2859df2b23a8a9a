package erofs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/layercache/layercache/layerfs/erofs/erofstest"
	"golang.org/x/sys/unix"
)

// basicTree has one of everything the writer must carry.
func basicTree(t *testing.T) string { return basicTreeIn(t, t.TempDir()) }

// basicTreeIn makes in dir one entry of each kind, with xattrs of each
// prefix (overlayfs's own among them) and a hard link.
func basicTreeIn(t testing.TB, dir string) string {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open")
	defer unix.Close(fd)
	mkfile(t, fd, "empty", nil, 0o644)
	mkfile(t, fd, "small", []byte("hello\n"), 0o4755)
	big := make([]byte, 3*BlockSize+100)
	for i := range big {
		big[i] = byte(i * 7)
	}
	mkfile(t, fd, "big", big, 0o600)
	must(t, unix.Linkat(fd, "big", fd, "big.link", 0), "link")
	must(t, unix.Symlinkat("small", fd, "sym"), "symlink")
	must(t, unix.Mkdirat(fd, "d", 0o1777), "mkdir")
	must(t, unix.Fchmodat(fd, "d", 0o1777, 0), "chmod")
	must(t, unix.Mknodat(fd, "wh", unix.S_IFCHR, 0), "whiteout")
	must(t, unix.Mknodat(fd, "chr", unix.S_IFCHR|0o620, int(unix.Mkdev(4, 1))), "chr")
	must(t, unix.Mknodat(fd, "blk", unix.S_IFBLK|0o660, int(unix.Mkdev(259, 300000))), "blk")
	must(t, unix.Mknodat(fd, "fifo", unix.S_IFIFO|0o644, 0), "fifo")
	must(t, unix.Mknodat(fd, "sock", unix.S_IFSOCK|0o755, 0), "sock")
	must(t, unix.Fchownat(fd, "small", 100000, 70000, unix.AT_SYMLINK_NOFOLLOW), "chown")
	setxattr(t, fd, "d", "trusted.overlay.opaque", "y")
	setxattr(t, fd, "d", "trusted.overlay.origin", "dropme")
	setxattr(t, fd, "small", "user.overlay.redirect", "dropme")
	setxattr(t, fd, "small", "user.k", "v")
	setxattr(t, fd, "small", "security.x", "sec")
	setxattr(t, fd, "", "trusted.root", "r")
	return dir
}

func TestWriteBasic(t *testing.T) {
	requireTools(t)
	src := basicTree(t)
	img, st := writeImage(t, src)
	t.Logf("stats %+v", st)
	mnt := mountImage(t, img)
	erofstest.CompareTrees(t, src, mnt)
}

// TestOverlayLower mounts an image as the upper of two overlay lower
// layers, which is how a receiving node uses it.
func TestOverlayLower(t *testing.T) {
	requireTools(t)
	below := t.TempDir()
	bfd, err := unix.Open(below, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open")
	defer unix.Close(bfd)
	mkfile(t, bfd, "gone", []byte("hidden by a whiteout"), 0o644)
	must(t, unix.Mkdirat(bfd, "opq", 0o755), "mkdir")
	mkfile(t, bfd, "opq/below", []byte("hidden by opaque"), 0o644)
	must(t, unix.Mkdirat(bfd, "merged", 0o755), "mkdir")
	mkfile(t, bfd, "merged/below", []byte("stays"), 0o644)

	layer := t.TempDir()
	lfd, err := unix.Open(layer, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open")
	defer unix.Close(lfd)
	must(t, unix.Mknodat(lfd, "gone", unix.S_IFCHR, 0), "whiteout")
	must(t, unix.Mkdirat(lfd, "opq", 0o755), "mkdir")
	setxattr(t, lfd, "opq", "trusted.overlay.opaque", "y")
	mkfile(t, lfd, "opq/above", []byte("a"), 0o644)
	must(t, unix.Mkdirat(lfd, "merged", 0o755), "mkdir")
	mkfile(t, lfd, "merged/above", []byte("b"), 0o644)
	mkfile(t, lfd, ".wh.keep", []byte("plain"), 0o644)
	mkfile(t, lfd, ".wh..wh..opq", []byte("plain too"), 0o644)
	must(t, unix.Mknodat(lfd, "sock", unix.S_IFSOCK|0o755, 0), "sock")
	must(t, unix.Mknodat(lfd, "fifo", unix.S_IFIFO|0o644, 0), "fifo")

	img, _ := writeImage(t, layer)
	lower := mountImage(t, img)
	ovl := filepath.Join(t.TempDir(), "ovl")
	must(t, os.Mkdir(ovl, 0o755), "mkdir")
	opts := "lowerdir=" + lower + ":" + below
	if err := unix.Mount("overlay", ovl, "overlay", unix.MS_RDONLY, opts); err != nil {
		t.Fatalf("mount -t overlay -o %s: %v", opts, err)
	}
	t.Cleanup(func() { unmount(t, ovl) })

	for _, tc := range []struct {
		path string
		typ  uint32 // 0: must not exist
	}{
		{"gone", 0},
		{"opq/below", 0},
		{"opq/above", unix.S_IFREG},
		{"merged/above", unix.S_IFREG},
		{"merged/below", unix.S_IFREG},
		{".wh.keep", unix.S_IFREG},
		{".wh..wh..opq", unix.S_IFREG},
		{"sock", unix.S_IFSOCK},
		{"fifo", unix.S_IFIFO},
	} {
		var st unix.Stat_t
		err := unix.Lstat(filepath.Join(ovl, tc.path), &st)
		switch {
		case tc.typ == 0 && err == nil:
			t.Errorf("%s: visible through the overlay, want hidden", tc.path)
		case tc.typ == 0 && !errors.Is(err, unix.ENOENT):
			t.Errorf("%s: %v, want ENOENT", tc.path, err)
		case tc.typ != 0 && err != nil:
			t.Errorf("%s: %v", tc.path, err)
		case tc.typ != 0 && st.Mode&unix.S_IFMT != tc.typ:
			t.Errorf("%s: type %o, want %o", tc.path, st.Mode&unix.S_IFMT, tc.typ)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ovl, ".wh.keep")); err != nil || string(b) != "plain" {
		t.Errorf(".wh.keep reads %q, %v", b, err)
	}
}

// TestDeterministic: the same tree, and a cp -a copy of it (other inode
// numbers, other atimes and ctimes), give the same bytes.
func TestDeterministic(t *testing.T) {
	requireTools(t)
	src := basicTree(t)
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open")
	defer unix.Close(sfd)
	holey(t, sfd, "sparse", 1<<20, []int64{0, 512 << 10})
	img1, _ := writeImage(t, src)
	img2, _ := writeImage(t, src)
	cp := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", src, cp).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v\n%s", err, out)
	}
	img3, _ := writeImage(t, cp)
	a, b, c := sha(t, img1), sha(t, img2), sha(t, img3)
	if !bytes.Equal(a, b) {
		t.Error("two writes of the same tree differ")
	}
	if !bytes.Equal(a, c) {
		t.Error("a cp -a copy of the tree gives other bytes")
	}
}

// holey creates a file of size with 4 KiB of data at each offset.
func holey(t testing.TB, dfd int, name string, size int64, data []int64) {
	t.Helper()
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
	must(t, err, "create")
	defer unix.Close(fd)
	must(t, unix.Ftruncate(fd, size), "truncate")
	buf := bytes.Repeat([]byte("data"), BlockSize/4)
	for _, off := range data {
		_, err := unix.Pwrite(fd, buf[:min(int64(len(buf)), size-off)], off)
		must(t, err, "pwrite")
	}
}

// TestSparseTerabyte: a 1 TiB file with 4 KiB of data at 512 GiB becomes a
// small image without reading the holes.
func TestSparseTerabyte(t *testing.T) {
	requireTools(t)
	src := t.TempDir()
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open")
	defer unix.Close(sfd)
	holey(t, sfd, "tera", 1<<40, []int64{512 << 30})
	img, st := writeImage(t, src) // includes fsck.erofs
	t.Logf("1 TiB sparse: image %d bytes (%.1f MiB), data %d bytes", st.ImageBytes, float64(st.ImageBytes)/(1<<20), st.DataBytes)
	// A writer that read the holes would take many minutes for 1 TiB and
	// trip the test timeout; its image size says it stored none of them.
	if st.ImageBytes > 64<<20 {
		t.Errorf("image is %d bytes, want at most 64 MiB", st.ImageBytes)
	}
	erofstest.CompareTrees(t, src, mountImage(t, img))
}

// TestDeepTree: 2,100 levels, paths far past PATH_MAX.
func TestDeepTree(t *testing.T) {
	requireTools(t)
	src := t.TempDir()
	erofstest.DeepPath(t, src, erofstest.DeepDepth)
	img, _ := writeImage(t, src)
	erofstest.CompareTrees(t, src, mountImage(t, img))
}

func TestParseSuperblock(t *testing.T) {
	requireTools(t)
	src := basicTree(t)
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open")
	defer unix.Close(sfd)
	holey(t, sfd, "sparse", 1<<20, []int64{0})
	img, st := writeImage(t, src)
	first := sha(t, img)[:BlockSize]
	sb, err := ParseSuperblock(first)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ImageBytes() != st.ImageBytes || int64(sb.Inodes) != st.Inodes {
		t.Errorf("superblock says %d bytes, %d inodes; Write said %+v", sb.ImageBytes(), sb.Inodes, st)
	}
	for _, tc := range []struct {
		name string
		off  int
		val  byte
	}{
		{"bad magic", superOffset, 0},
		{"block size 8K", superOffset + 12, 13},
		{"checksum", superOffset + 4, 1},
		{"compat feature", superOffset + 8, 1},
		{"compression feature", superOffset + 80, 0x07},
		{"extra devices", superOffset + 86, 1},
		{"packed inode", superOffset + 96, 1},
	} {
		b := bytes.Clone(first)
		b[tc.off] = tc.val
		if _, err := ParseSuperblock(b); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if _, err := ParseSuperblock(first[:1000]); err == nil {
		t.Error("short buffer accepted")
	}
}

func TestRefusals(t *testing.T) {
	requireTools(t)
	src := t.TempDir()
	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open")
	defer unix.Close(fd)
	must(t, unix.Mkdirat(fd, "sub", 0o755), "mkdir")
	mkfile(t, fd, "sub/f", nil, 0o644)
	sub, err := unix.Openat(fd, "sub", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open")
	defer unix.Close(sub)
	// ext4 refuses to store other system.* xattrs, so check the mapping.
	if _, _, ok := xattrIndex("system.nfs4_acl"); ok {
		t.Error("system.nfs4_acl mapped to an EROFS prefix")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Write(ctx, src, io.Discard); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Write: %v, want context.Canceled", err)
	}
	if _, err := Write(context.Background(), filepath.Join(src, "missing"), io.Discard); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing dir: %v", err)
	}
}
