package tree

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/continuity/sysx"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Copy copies the tree at src into the existing directory dst, keeping
// content, type, mode, owner, xattrs, times, symlinks, device nodes and
// hardlinks. report is called with the number of entries copied so far.
//
// It works on directory file descriptors (openat and friends), so the depth
// of the tree does not matter: a path 2,100 directories deep is longer than
// PATH_MAX, and every path-based call on it fails with ENAMETOOLONG. It
// holds two open directories per level and reads each directory in chunks
// of dirChunk entries, so memory does not grow with a directory's size.
func Copy(src, dst string, report func(done int64)) error {
	return CopyContext(context.Background(), src, dst, report)
}

// CopyContext is Copy that stops, with ctx's error, once ctx is done: a
// pull held to a deadline must not copy on past it. What it copied so far
// stays in dst for the caller to remove.
func CopyContext(ctx context.Context, src, dst string, report func(done int64)) error {
	srcDir, err := openDir(src)
	if err != nil {
		return err
	}
	defer srcDir.Close()
	dstDir, err := openDir(dst)
	if err != nil {
		return err
	}
	defer dstDir.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(srcDir.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	ondisk.FaultPoint()
	if err := copyMeta(srcDir, dstDir, ".", &st); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	c := &treeCopier{ctx: ctx, dstRoot: dstDir, links: map[[2]uint64]string{}, report: report, done: 1}
	if err := c.copyDir(srcDir, dstDir, ""); err != nil {
		return err
	}
	// Directory times last: creating their entries changed them.
	if err := setTimesAt(dstDir, ".", &st); err != nil {
		return err
	}
	if report != nil {
		report(c.done)
	}
	return nil
}

type treeCopier struct {
	ctx     context.Context
	dstRoot *os.File
	links   map[[2]uint64]string // (dev, ino) -> path of the first copy below dstRoot
	report  func(done int64)
	done    int64
}

func (c *treeCopier) copyDir(src, dst *os.File, rel string) error {
	return forEachName(src, rel, func(name string) error {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(int(src.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", joinRel(rel, name), err)
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		key := [2]uint64{st.Dev, st.Ino}
		if !isDir && st.Nlink > 1 {
			if first, ok := c.links[key]; ok {
				return c.link(first, dst, name)
			}
		}
		ondisk.FaultPoint()
		if err := copyEntryAt(src, dst, name, &st); err != nil {
			return fmt.Errorf("copy %s: %w", joinRel(rel, name), err)
		}
		switch {
		case isDir:
			if err := c.copySubdir(src, dst, name, joinRel(rel, name), &st); err != nil {
				return err
			}
		case st.Nlink > 1:
			c.links[key] = joinRel(rel, name)
		}
		c.done++
		if c.report != nil && c.done%1024 == 0 {
			c.report(c.done)
		}
		return nil
	})
}

func (c *treeCopier) copySubdir(src, dst *os.File, name, rel string, st *unix.Stat_t) error {
	subSrc, err := openDirAt(src, name)
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	defer subSrc.Close()
	subDst, err := openDirAt(dst, name)
	if err != nil {
		return fmt.Errorf("open copy of %s: %w", rel, err)
	}
	defer subDst.Close()
	if err := c.copyDir(subSrc, subDst, rel); err != nil {
		return err
	}
	return setTimesAt(dst, name, st)
}

// link makes dst/name a hardlink of the copy at first (relative to the
// copy's root), walking to it one directory at a time: its path may be
// longer than PATH_MAX. Hardlinks are rare; files with many links are not.
func (c *treeCopier) link(first string, dst *os.File, name string) error {
	dir, base := filepath.Split(first)
	parent := c.dstRoot
	for _, comp := range strings.Split(strings.Trim(dir, "/"), "/") {
		if comp == "" {
			continue
		}
		next, err := openDirAt(parent, comp)
		if parent != c.dstRoot {
			parent.Close()
		}
		if err != nil {
			return fmt.Errorf("hardlink to %s: %w", first, err)
		}
		parent = next
	}
	if parent != c.dstRoot {
		defer parent.Close()
	}
	if err := unix.Linkat(int(parent.Fd()), base, int(dst.Fd()), name, 0); err != nil {
		return fmt.Errorf("hardlink %s to %s: %w", name, first, err)
	}
	return nil
}

func joinRel(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// copyEntryAt creates one entry (except a directory's contents) with its
// metadata.
func copyEntryAt(src, dst *os.File, name string, st *unix.Stat_t) error {
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return fmt.Errorf("mkdir: %w", err)
		}
	case unix.S_IFREG:
		if err := copyFileAt(src, dst, name); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := readlinkAt(sfd, name, st.Size)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod: %w", err)
		}
	default:
		return fmt.Errorf("unsupported file type %o", st.Mode&unix.S_IFMT)
	}
	if err := copyMeta(src, dst, name, st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil // times are set after its contents
	}
	return setTimesAt(dst, name, st)
}

// copyMeta copies owner, xattrs and mode of src/name to dst/name. The order
// matters: chown clears set-id bits and capabilities, so ownership comes
// before xattrs and mode.
func copyMeta(src, dst *os.File, name string, st *unix.Stat_t) error {
	dfd := int(dst.Fd())
	if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := copyXattrs(fdPath(src, name), fdPath(dst, name)); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, name, st.Mode&0o7777, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	return nil
}

// fdPath names dir/name through /proc/self/fd, a short path for calls
// that have no *at form (the xattr calls before Linux 6.13). The final
// component is not followed by the l* calls that use it.
func fdPath(dir *os.File, name string) string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), name)
}

func readlinkAt(dirfd int, name string, size int64) (string, error) {
	buf := make([]byte, max(size, 64)+1)
	for range 8 {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", fmt.Errorf("readlink: %w", err)
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, 2*len(buf)) // changed since stat
	}
	return "", errors.New("readlink: the link keeps growing")
}

func copyFileAt(src, dst *os.File, name string) error {
	ifd, err := unix.Openat(int(src.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	in := os.NewFile(uintptr(ifd), name)
	defer in.Close()
	ofd, err := unix.Openat(int(dst.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	out := os.NewFile(uintptr(ofd), name)
	if err := copyFileSparse(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyFileSparse copies a regular file's content into a new file dst, data
// range by data range, so holes stay holes: a sparse 1 TiB disk image must
// not become 1 TiB of zeros on the node (continuity's CopyFile and io.Copy
// both read holes as zeros). Each data range goes through File.ReadFrom,
// which uses copy_file_range and so reflinks on filesystems that can.
func copyFileSparse(out, in *os.File) error {
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	// The whole length as one hole first; data ranges are written into it.
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	for off := int64(0); off < size; {
		start, end, err := nextData(in, off, size)
		if err != nil {
			return fmt.Errorf("find data: %w", err)
		}
		if start >= size {
			break // the rest is a hole
		}
		if err := copyRange(out, in, start, end-start); err != nil {
			return fmt.Errorf("copy data: %w", err)
		}
		off = end
	}
	return nil
}

// nextData returns the data range at or after off. A filesystem without
// SEEK_DATA reports the rest of the file as data, which is still correct.
func nextData(f *os.File, off, size int64) (start, end int64, err error) {
	fd := int(f.Fd())
	start, err = unix.Seek(fd, off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return size, size, nil // no data after off
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
		return off, size, nil
	case err != nil:
		return 0, 0, err
	}
	end, err = unix.Seek(fd, start, unix.SEEK_HOLE)
	if err != nil {
		return 0, 0, err
	}
	return start, min(end, size), nil
}

func copyRange(out, in *os.File, off, n int64) error {
	if _, err := in.Seek(off, io.SeekStart); err != nil {
		return err
	}
	if _, err := out.Seek(off, io.SeekStart); err != nil {
		return err
	}
	copied, err := io.CopyN(out, in, n)
	if err == io.EOF && copied < n {
		return fmt.Errorf("file shrank while copied (%d of %d bytes at offset %d)", copied, n, off)
	}
	return err
}

func copyXattrs(src, dst string) error {
	keys, err := sysx.LListxattr(src)
	if err != nil {
		return fmt.Errorf("list xattrs of %s: %w", src, err)
	}
	for _, k := range keys {
		v, err := sysx.LGetxattr(src, k)
		if err != nil {
			return fmt.Errorf("get xattr %s of %s: %w", k, src, err)
		}
		if err := sysx.LSetxattr(dst, k, v, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", k, dst, err)
		}
	}
	return nil
}

func setTimesAt(dir *os.File, name string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(int(dir.Fd()), name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", name, err)
	}
	return nil
}

// DiskUsage sums the allocated bytes and counts the entries of a tree,
// counting each hardlinked inode once. Allocated, not apparent: a sparse
// file costs the node only its data, and GC bounds what the node pays.
// Like Copy it walks directory descriptors in chunks, so neither depth
// nor directory size matters.
func DiskUsage(dir string) (bytes, files int64, err error) {
	root, err := openDir(dir)
	if err != nil {
		return 0, 0, err
	}
	defer root.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(root.Fd()), &st); err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", dir, err)
	}
	u := &usage{seen: map[uint64]bool{}}
	u.add(&st)
	if err := u.walk(root, ""); err != nil {
		return 0, 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	return u.bytes, u.files, nil
}

type usage struct {
	bytes, files int64
	seen         map[uint64]bool // hardlinked inodes
}

func (u *usage) add(st *unix.Stat_t) {
	u.files++
	if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if u.seen[st.Ino] {
			return
		}
		u.seen[st.Ino] = true
	}
	u.bytes += st.Blocks * 512
}

func (u *usage) walk(dir *os.File, rel string) error {
	return forEachName(dir, rel, func(name string) error {
		var st unix.Stat_t
		if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", joinRel(rel, name), err)
		}
		u.add(&st)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return nil
		}
		sub, err := openDirAt(dir, name)
		if err != nil {
			return fmt.Errorf("open %s: %w", joinRel(rel, name), err)
		}
		defer sub.Close()
		return u.walk(sub, joinRel(rel, name))
	})
}

// dirChunk is how many names a walk reads from a directory at once: memory
// stays flat however many files one directory holds.
const dirChunk = 1024

// forEachName calls fn for each name in dir, reading dirChunk at a time.
func forEachName(dir *os.File, rel string, fn func(name string) error) error {
	for {
		names, err := dir.Readdirnames(dirChunk)
		for _, n := range names {
			if ferr := fn(n); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read directory %s: %w", cmp.Or(rel, "."), err)
		}
	}
}

func openDir(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open directory %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openDirAt opens the directory name in dir without following a symlink.
func openDirAt(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Empty empties dir, keeping dir itself. It reads dirChunk names at a
// time (a torn upper layer may hold a huge directory) and removes only
// names it has read, which readdir returns once each however the directory
// changes meanwhile.
func Empty(dir string) error {
	d, err := openDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return forEachName(d, dir, func(name string) error {
		return os.RemoveAll(filepath.Join(dir, name))
	})
}
