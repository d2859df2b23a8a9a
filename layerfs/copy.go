package layerfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/continuity/sysx"
	"golang.org/x/sys/unix"
)

// copyTree copies the tree at src into the existing directory dst, keeping
// content, type, mode, owner, xattrs, times, symlinks, device nodes and
// hardlinks. report is called with the number of entries copied so far.
func copyTree(src, dst string, report func(done int64)) error {
	type dirTimes struct {
		path string
		st   *unix.Stat_t
	}
	var (
		dirs  []dirTimes
		links = map[[2]uint64]string{} // (dev, ino) -> first copy, for hardlinks
		done  int64
	)
	err := filepath.WalkDir(src, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := links[key]; ok {
			return os.Link(first, target)
		}
		faultPoint()
		if err := copyEntry(path, target, &st, rel == "."); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			dirs = append(dirs, dirTimes{target, &st})
		} else if st.Nlink > 1 {
			links[key] = target
		}
		done++
		if report != nil && done%1024 == 0 {
			report(done)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Directory times last: creating their entries changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := setTimes(dirs[i].path, dirs[i].st); err != nil {
			return err
		}
	}
	if report != nil {
		report(done)
	}
	return nil
}

// copyEntry creates one entry (except a directory's contents) with its
// metadata. The order matters: chown clears set-id bits and capabilities,
// so ownership comes before xattrs and mode.
func copyEntry(src, dst string, st *unix.Stat_t, isRoot bool) error {
	mode := st.Mode & 0o7777
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if !isRoot {
			if err := os.Mkdir(dst, 0o700); err != nil {
				return err
			}
		}
	case unix.S_IFREG:
		if err := copyFileSparse(dst, src); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", dst, err)
		}
	default:
		return fmt.Errorf("copy %s: unsupported file type %o", src, st.Mode&unix.S_IFMT)
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, mode); err != nil {
			return fmt.Errorf("chmod %s: %w", dst, err)
		}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil // set after its contents
	}
	return setTimes(dst, st)
}

// copyFileSparse copies a regular file's content into a new file dst, data
// range by data range, so holes stay holes: a sparse 1 TiB disk image must
// not become 1 TiB of zeros on the node (continuity's CopyFile and io.Copy
// both read holes as zeros). Each data range goes through File.ReadFrom,
// which uses copy_file_range and so reflinks on filesystems that can.
func copyFileSparse(dst, src string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	// The whole length as one hole first; data ranges are written into it.
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("truncate %s: %w", dst, err)
	}
	for off := int64(0); off < size; {
		start, end, err := nextData(in, off, size)
		if err != nil {
			return fmt.Errorf("find data in %s: %w", src, err)
		}
		if start >= size {
			break // the rest is a hole
		}
		if err := copyRange(out, in, start, end-start); err != nil {
			return fmt.Errorf("copy %s to %s: %w", src, dst, err)
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

func setTimes(path string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", path, err)
	}
	return nil
}

// diskUsage sums the apparent sizes and counts the entries of a tree,
// counting each hardlinked inode once.
func diskUsage(dir string) (bytes, files int64, err error) {
	seen := map[uint64]bool{}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		files++
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		bytes += st.Blocks * 512
		return nil
	})
	return bytes, files, err
}
