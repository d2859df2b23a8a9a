package erofstest

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// CompareOption relaxes one of CompareTrees's rules.
type CompareOption func(*compareOptions)

type compareOptions struct {
	ignoreRootMtime   bool
	ignoreUnreachable bool
}

// IgnoreRootMtime leaves out the mtime of the two roots. Two overlay
// views of the same layers have each their own upper directory as root,
// made when the volume was, so their mtimes are those of two mkdirs.
func IgnoreRootMtime() CompareOption {
	return func(o *compareOptions) { o.ignoreRootMtime = true }
}

// IgnoreDanglingWhiteouts leaves out, on each side, a name that readdir
// lists but lookup does not find. Both trees must be overlay mounts, where
// that is a whiteout in a lower directory that nothing below it merges
// with: overlayfs hides the name from lookup, but its readdir passes such
// a directory's entries through unfiltered, unless the directory carries
// overlay xattrs that the image writer drops (trusted.overlay.origin) and
// the node that built the layer still has. Whiteouts that cover something
// are compared as usual, by their effect: the name is absent on both sides.
func IgnoreDanglingWhiteouts() CompareOption {
	return func(o *compareOptions) { o.ignoreUnreachable = true }
}

// CompareTrees walks want and got by directory fd (so depth past PATH_MAX
// works) and reports every difference in an entry's type, mode, owner,
// size, mtime, device number, link count, symlink target, xattrs and
// bytes, and every hardlink group that got splits or merges. From want it
// leaves out the overlay xattrs the image writer drops (see dropXattr).
// It stops the test after 30 differences.
func CompareTrees(t testing.TB, want, got string, opts ...CompareOption) {
	t.Helper()
	c := &comparer{t: t, links: map[uint64]uint64{}, back: map[uint64]uint64{}, buf1: make([]byte, 1<<20), buf2: make([]byte, 1<<20)}
	for _, opt := range opts {
		opt(&c.opts)
	}
	a, err := unix.Open(want, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(a)
	b, err := unix.Open(got, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(b)
	c.entry(a, b, "", ".")
	c.dir(a, b, ".")
}

type comparer struct {
	t          testing.TB
	opts       compareOptions
	links      map[uint64]uint64 // want ino -> got ino
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

func (c *comparer) listNames(fd int) []string {
	dup, err := unix.Dup(fd)
	if err != nil {
		c.t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.opts.ignoreUnreachable {
		names = slices.DeleteFunc(names, func(name string) bool {
			_, err := statAt(fd, name)
			return errors.Is(err, unix.ENOENT)
		})
	}
	slices.Sort(names)
	return names
}

func (c *comparer) dir(a, b int, rel string) {
	c.t.Helper()
	na, nb := c.listNames(a), c.listNames(b)
	if !slices.Equal(na, nb) {
		c.errorf("%s: entries differ:\n want %q\n got  %q", rel, na, nb)
		return
	}
	for _, name := range na {
		r := rel + "/" + name
		if c.entry(a, b, name, r) {
			c.subdir(a, b, name, r)
		}
	}
}

// subdir compares the directories name in a and b. Its fds are closed on
// every path, or a failed test would leave a mount it walked busy.
func (c *comparer) subdir(a, b int, name, rel string) {
	c.t.Helper()
	ca, err := unix.Openat(a, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer unix.Close(ca)
	cb, err := unix.Openat(b, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer unix.Close(cb)
	c.dir(ca, cb, rel)
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
		c.t.Fatalf("%s: %v", rel, err)
	}
	sb, err := statAt(b, name)
	if err != nil {
		c.t.Fatalf("%s: %v", rel, err)
	}
	if sa.Mode != sb.Mode || sa.Uid != sb.Uid || sa.Gid != sb.Gid || sa.Rdev != sb.Rdev || sa.Nlink != sb.Nlink {
		c.errorf("%s: mode/uid/gid/rdev/nlink want %o %d %d %d:%d %d, got %o %d %d %d:%d %d", rel,
			sa.Mode, sa.Uid, sa.Gid, unix.Major(sa.Rdev), unix.Minor(sa.Rdev), sa.Nlink,
			sb.Mode, sb.Uid, sb.Gid, unix.Major(sb.Rdev), unix.Minor(sb.Rdev), sb.Nlink)
	}
	if sa.Mtim != sb.Mtim && !(name == "" && c.opts.ignoreRootMtime) {
		c.errorf("%s: mtime want %v, got %v", rel, time.Unix(sa.Mtim.Unix()), time.Unix(sb.Mtim.Unix()))
	}
	typ := sa.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && sa.Size != sb.Size {
		c.errorf("%s: size want %d, got %d", rel, sa.Size, sb.Size)
	}
	if typ != unix.S_IFDIR && sa.Nlink > 1 {
		if prev, ok := c.links[sa.Ino]; ok && prev != sb.Ino {
			c.errorf("%s: hardlink group split", rel)
		}
		if prev, ok := c.back[sb.Ino]; ok && prev != sa.Ino {
			c.errorf("%s: distinct files share an inode", rel)
		}
		c.links[sa.Ino], c.back[sb.Ino] = sb.Ino, sa.Ino
	}
	if xa, xb := xattrsAt(c.t, a, name, true), xattrsAt(c.t, b, name, false); !equalMaps(xa, xb) {
		c.errorf("%s: xattrs want %q, got %q", rel, xa, xb)
	}
	switch typ {
	case unix.S_IFLNK:
		la, lb := readlink(c.t, a, name), readlink(c.t, b, name)
		if la != lb {
			c.errorf("%s: symlink target want %q, got %q", rel, la, lb)
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

// dropXattr restates the image writer's rule (erofs's dropXattr, which
// this package cannot import): of overlayfs's own xattrs only
// trusted.overlay.opaque is layer content; the others describe the
// builder's upper directory and stay behind.
func dropXattr(name string) bool {
	if name == "trusted.overlay.opaque" {
		return false
	}
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
}

// xattrsAt reads the xattrs of name in fd (fd itself if name is ""); for
// the wanted tree it leaves out the overlay xattrs the writer drops.
func xattrsAt(t testing.TB, fd int, name string, want bool) map[string]string {
	path := fdPath(fd, name)
	list := make([]byte, 65536)
	n, err := unix.Llistxattr(path, list)
	if err != nil {
		t.Fatalf("llistxattr %s: %v", path, err)
	}
	m := map[string]string{}
	val := make([]byte, 65536)
	for _, x := range strings.Split(string(list[:n]), "\x00") {
		if x == "" || (want && dropXattr(x)) {
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

// content compares file bytes. Big files are compared where want has
// data, plus the first and last MiB (an image may report its holes as
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
				c.errorf("%s: read got at %d: %v", rel, off, err)
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
