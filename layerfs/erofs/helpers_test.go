package erofs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireTools fails (never skips) a test that cannot run here: these
// tests mount images and make devices, and check every image with an
// independent reader.
func requireTools(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (it mounts EROFS images and creates device nodes); run it as root")
	}
	if _, err := exec.LookPath("fsck.erofs"); err != nil {
		t.Fatal("fsck.erofs not found; install it with: apt-get install erofs-utils")
	}
}

// writeImage writes dir as an image in a temp file, checks it with
// fsck.erofs and returns its path.
func writeImage(t testing.TB, dir string) (string, Stats) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "layer.erofs")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Write(context.Background(), dir, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("Write(%s): %v", dir, err)
	}
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != st.ImageBytes {
		t.Fatalf("image is %d bytes, Stats.ImageBytes says %d", fi.Size(), st.ImageBytes)
	}
	fsck(t, img)
	return img, st
}

func fsck(t testing.TB, img string) {
	t.Helper()
	// fsck.erofs recurses per directory level with ~12 KiB of stack each;
	// the 2,100-deep tree needs more than the default 8 MiB.
	out, err := exec.Command("sh", "-c", `ulimit -s unlimited && exec fsck.erofs "$1"`, "sh", img).CombinedOutput()
	if err != nil {
		t.Fatalf("fsck.erofs %s: %v\n%s", img, err, out)
	}
}

// mountImage mounts img read-only, file-backed, and unmounts it at cleanup.
func mountImage(t testing.TB, img string) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(img, mnt, "erofs", unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("mount -t erofs -o ro %s %s: %v (needs a kernel with file-backed EROFS, 6.12+)", img, mnt, err)
	}
	t.Cleanup(func() { unmount(t, mnt) })
	return mnt
}

func unmount(t testing.TB, mnt string) {
	if err := unix.Unmount(mnt, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	}
}

// compareTrees walks src and the mounted image by directory fd (so depth
// past PATH_MAX works) and reports every difference.
func compareTrees(t testing.TB, src, mnt string) {
	t.Helper()
	a, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(a)
	b, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(b)
	c := &comparer{t: t, links: map[uint64]uint64{}, back: map[uint64]uint64{}, buf1: make([]byte, 1<<20), buf2: make([]byte, 1<<20)}
	c.entry(a, b, "", ".")
	c.dir(a, b, ".")
}

type comparer struct {
	t          testing.TB
	links      map[uint64]uint64 // source ino -> image ino
	back       map[uint64]uint64
	buf1, buf2 []byte
	errs       int
}

func (c *comparer) errorf(format string, args ...any) {
	c.t.Helper()
	c.errs++
	if c.errs > 30 {
		c.t.FailNow()
	}
	c.t.Errorf(format, args...)
}

func listNames(t testing.TB, fd int) []string {
	dup, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func (c *comparer) dir(a, b int, rel string) {
	c.t.Helper()
	na, nb := listNames(c.t, a), listNames(c.t, b)
	if !slices.Equal(na, nb) {
		c.errorf("%s: entries differ:\n src %q\n img %q", rel, na, nb)
		return
	}
	for _, name := range na {
		r := rel + "/" + name
		if c.entry(a, b, name, r) {
			ca, err := unix.Openat(a, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
			if err != nil {
				c.t.Fatal(err)
			}
			cb, err := unix.Openat(b, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
			if err != nil {
				c.t.Fatal(err)
			}
			c.dir(ca, cb, r)
			unix.Close(ca)
			unix.Close(cb)
		}
	}
}

func statAt(fd int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if name == "" {
		return st, unix.Fstat(fd, &st)
	}
	return st, unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
}

// entry compares one entry; it says whether it is a directory to descend.
func (c *comparer) entry(a, b int, name, rel string) bool {
	c.t.Helper()
	sa, err := statAt(a, name)
	if err != nil {
		c.t.Fatal(err)
	}
	sb, err := statAt(b, name)
	if err != nil {
		c.t.Fatal(err)
	}
	if sa.Mode != sb.Mode || sa.Uid != sb.Uid || sa.Gid != sb.Gid || sa.Rdev != sb.Rdev || sa.Nlink != sb.Nlink {
		c.errorf("%s: mode/uid/gid/rdev/nlink src %o %d %d %d:%d %d, img %o %d %d %d:%d %d", rel,
			sa.Mode, sa.Uid, sa.Gid, unix.Major(sa.Rdev), unix.Minor(sa.Rdev), sa.Nlink,
			sb.Mode, sb.Uid, sb.Gid, unix.Major(sb.Rdev), unix.Minor(sb.Rdev), sb.Nlink)
	}
	if sa.Mtim != sb.Mtim {
		c.errorf("%s: mtime src %v, img %v", rel, time.Unix(sa.Mtim.Unix()), time.Unix(sb.Mtim.Unix()))
	}
	typ := sa.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && sa.Size != sb.Size {
		c.errorf("%s: size src %d, img %d", rel, sa.Size, sb.Size)
	}
	if typ != unix.S_IFDIR && sa.Nlink > 1 {
		if prev, ok := c.links[sa.Ino]; ok && prev != sb.Ino {
			c.errorf("%s: hardlink group split in the image", rel)
		}
		if prev, ok := c.back[sb.Ino]; ok && prev != sa.Ino {
			c.errorf("%s: distinct files share an inode in the image", rel)
		}
		c.links[sa.Ino], c.back[sb.Ino] = sb.Ino, sa.Ino
	}
	if xa, xb := xattrsAt(c.t, a, name, true), xattrsAt(c.t, b, name, false); !equalMaps(xa, xb) {
		c.errorf("%s: xattrs src %q, img %q", rel, xa, xb)
	}
	switch typ {
	case unix.S_IFLNK:
		la, lb := readlink(c.t, a, name), readlink(c.t, b, name)
		if la != lb {
			c.errorf("%s: symlink target src %q, img %q", rel, la, lb)
		}
	case unix.S_IFREG:
		c.content(a, b, name, rel, sa.Size)
	}
	return typ == unix.S_IFDIR
}

func readlink(t testing.TB, fd int, name string) string {
	buf := make([]byte, 8192)
	n, err := unix.Readlinkat(fd, name, buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// xattrsAt reads the xattrs of name in fd (fd itself if name is ""); for
// the source it leaves out the overlay xattrs the writer drops.
func xattrsAt(t testing.TB, fd int, name string, source bool) map[string]string {
	path := "/proc/self/fd/" + strconv.Itoa(fd) + "/."
	if name != "" {
		path = path[:len(path)-1] + name
	}
	list := make([]byte, 65536)
	n, err := unix.Llistxattr(path, list)
	if err != nil {
		t.Fatalf("llistxattr %s: %v", path, err)
	}
	m := map[string]string{}
	val := make([]byte, 65536)
	for _, x := range strings.Split(string(list[:n]), "\x00") {
		if x == "" || (source && dropXattr(x)) {
			continue
		}
		vn, err := unix.Lgetxattr(path, x, val)
		if err != nil {
			t.Fatalf("lgetxattr %s %s: %v", path, x, err)
		}
		m[x] = string(val[:vn])
	}
	return m
}

// content compares file bytes. Big files are compared where the source
// has data, plus the first and last MiB (an image may report its holes as
// data, so reading all of a 1 TiB file is not an option).
func (c *comparer) content(a, b int, name, rel string, size int64) {
	c.t.Helper()
	fa, err := unix.Openat(a, name, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer unix.Close(fa)
	fb, err := unix.Openat(b, name, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer unix.Close(fb)
	var ranges [][2]int64
	if size <= 64<<20 {
		ranges = [][2]int64{{0, size}}
	} else {
		ranges = [][2]int64{{0, 1 << 20}, {size - 1<<20, size}}
		for pos := int64(0); pos < size; {
			d, err := unix.Seek(fa, pos, unix.SEEK_DATA)
			if err != nil {
				break
			}
			h, err := unix.Seek(fa, d, unix.SEEK_HOLE)
			if err != nil {
				c.t.Fatal(err)
			}
			ranges = append(ranges, [2]int64{d, h})
			pos = h
		}
	}
	for _, r := range ranges {
		for off := r[0]; off < r[1]; {
			n := int(min(int64(len(c.buf1)), r[1]-off))
			ra, err := unix.Pread(fa, c.buf1[:n], off)
			if err != nil {
				c.t.Fatal(err)
			}
			rb, err := unix.Pread(fb, c.buf2[:n], off)
			if err != nil {
				c.errorf("%s: read image at %d: %v", rel, off, err)
				return
			}
			if ra != rb || !bytes.Equal(c.buf1[:ra], c.buf2[:rb]) {
				c.errorf("%s: contents differ in [%d, %d)", rel, off, off+int64(n))
				return
			}
			if ra == 0 {
				break
			}
			off += int64(ra)
		}
	}
}

// --- tree building, by fd so depth is unbounded ---

func mkfile(t testing.TB, dfd int, name string, data []byte, mode uint32) {
	t.Helper()
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, mode)
	if err != nil {
		t.Fatalf("create %q: %v", name, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, data); err != nil && len(data) > 0 {
		t.Fatal(err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		t.Fatal(err)
	}
}

func must(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func setxattr(t testing.TB, dfd int, name, key, val string) {
	t.Helper()
	path := "/proc/self/fd/" + strconv.Itoa(dfd) + "/."
	if name != "" {
		path = path[:len(path)-1] + name
	}
	must(t, unix.Lsetxattr(path, key, []byte(val), 0), fmt.Sprintf("setxattr %s %s", name, key))
}

func sha(t testing.TB, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
