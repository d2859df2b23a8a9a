package erofs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// node is one inode of the tree, kept small: a 1M-entry tree holds a
// million of these plus the names.
type node struct {
	mode    uint32
	uid     uint32
	gid     uint32
	nlink   uint32
	rdev    uint32 // new_encode_dev form
	mtimeNs uint32
	mtime   int64
	size    int64  // for directories: the size of the dirent blocks
	xattrs  string // encoded inline xattr body, "" if none
	target  string // symlink target
	kids    []child
	parent  int32    // directories: the parent's index (root: itself)
	extents []extent // files with holes: block-aligned data ranges; nil if none

	// layout
	nid       uint64
	blkaddr   uint32
	layout    uint8
	chunkBits uint8
	emitted   bool
}

type child struct {
	name string
	idx  int32
}

// extent is a block-aligned range [off, end) of a file that holds data.
type extent struct{ off, end int64 }

func (n *node) isDir() bool  { return n.mode&unix.S_IFMT == unix.S_IFDIR }
func (n *node) isReg() bool  { return n.mode&unix.S_IFMT == unix.S_IFREG }
func (n *node) isLink() bool { return n.mode&unix.S_IFMT == unix.S_IFLNK }

type devIno struct{ dev, ino uint64 }

// scanner reads the tree into nodes, one directory fd per level and never
// a full path, so depth is bounded by open files, not PATH_MAX.
type scanner struct {
	ctx   context.Context
	nodes []node
	links map[devIno]int32
	stack []string // names from the root to the directory being read, for errors
	dent  []byte
	xlist []byte
	xval  []byte
	lbuf  []byte
}

func (s *scanner) rel(name string) string {
	if len(s.stack) == 0 && name == "" {
		return "."
	}
	p := strings.Join(s.stack, "/")
	if name == "" {
		return p
	}
	if p == "" {
		return name
	}
	return p + "/" + name
}

func (s *scanner) errorf(name, format string, args ...any) error {
	return fmt.Errorf("erofs: %s: "+format, append([]any{s.rel(name)}, args...)...)
}

func scanTree(ctx context.Context, dir string) (*scanner, error) {
	s := &scanner{
		ctx:   ctx,
		links: make(map[devIno]int32),
		dent:  make([]byte, 64<<10),
		xlist: make([]byte, 64<<10),
		xval:  make([]byte, 64<<10),
		lbuf:  make([]byte, unix.PathMax+1),
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("erofs: open layer directory %s: %w (pass an existing directory)", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("erofs: stat layer directory %s: %w", dir, err)
	}
	s.nodes = append(s.nodes, nodeFromStat(&st))
	s.nodes[0].nlink = 2
	s.nodes[0].parent = 0
	if s.nodes[0].xattrs, err = s.readXattrs(fd, ""); err != nil {
		return nil, err
	}
	if err := s.scanDir(fd, 0); err != nil {
		return nil, err
	}
	return s, nil
}

func nodeFromStat(st *unix.Stat_t) node {
	return node{
		mode:    st.Mode,
		uid:     st.Uid,
		gid:     st.Gid,
		nlink:   1,
		mtime:   st.Mtim.Sec,
		mtimeNs: uint32(st.Mtim.Nsec),
		size:    st.Size,
	}
}

// readNames lists a directory with getdents in fixed-size batches.
func (s *scanner) readNames(fd int) ([]string, error) {
	var names []string
	for {
		n, err := unix.Getdents(fd, s.dent)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, s.errorf("", "read directory: %w", err)
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(s.dent[:n], -1, names)
	}
	slices.Sort(names)
	return names, nil
}

func (s *scanner) scanDir(fd int, dirIdx int32) error {
	names, err := s.readNames(fd)
	if err != nil {
		return err
	}
	kids := make([]child, 0, len(names))
	for _, name := range names {
		if err := s.ctx.Err(); err != nil {
			return err
		}
		if len(name) > maxNameLen {
			return s.errorf(name, "name is %d bytes, EROFS stores at most %d", len(name), maxNameLen)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return s.errorf(name, "stat: %w (was the layer changed while it was written?)", err)
		}
		typ := st.Mode & unix.S_IFMT
		if typ != unix.S_IFDIR && st.Nlink > 1 {
			key := devIno{st.Dev, st.Ino}
			if idx, ok := s.links[key]; ok {
				s.nodes[idx].nlink++
				kids = append(kids, child{name, idx})
				continue
			}
			s.links[key] = int32(len(s.nodes))
		}
		idx := int32(len(s.nodes))
		s.nodes = append(s.nodes, nodeFromStat(&st))
		kids = append(kids, child{name, idx})
		n := &s.nodes[idx]
		switch typ {
		case unix.S_IFREG:
			if err := s.scanFile(fd, name, &st, idx); err != nil {
				return err
			}
		case unix.S_IFLNK:
			l, err := unix.Readlinkat(fd, name, s.lbuf)
			if err != nil {
				return s.errorf(name, "read symlink: %w", err)
			}
			n.target = string(s.lbuf[:l])
			n.size = int64(l)
		case unix.S_IFCHR, unix.S_IFBLK:
			major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)
			if major > 0xfff || minor > 0xfffff {
				return s.errorf(name, "device %d:%d does not fit EROFS's 12-bit major, 20-bit minor", major, minor)
			}
			n.rdev = newEncodeDev(major, minor)
			n.size = 0
		case unix.S_IFIFO, unix.S_IFSOCK:
			n.size = 0
		case unix.S_IFDIR:
			n.nlink = 2
			n.parent = dirIdx
			s.nodes[dirIdx].nlink++
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return s.errorf(name, "open directory: %w", err)
			}
			s.stack = append(s.stack, name)
			x, err := s.readXattrs(cfd, "")
			if err == nil {
				s.nodes[idx].xattrs = x
				err = s.scanDir(cfd, idx)
			}
			s.stack = s.stack[:len(s.stack)-1]
			unix.Close(cfd)
			if err != nil {
				return err
			}
			continue
		default:
			return s.errorf(name, "unknown file type %#o", typ)
		}
		x, err := s.readXattrs(fd, name)
		if err != nil {
			return err
		}
		s.nodes[idx].xattrs = x
	}
	s.nodes[dirIdx].kids = kids
	return nil
}

// scanFile finds the data ranges of a file that may have holes. A file
// whose allocated blocks cover its size is taken as dense without opening
// it; if it does have holes they are stored as zeros, which reads back the
// same.
func (s *scanner) scanFile(dirfd int, name string, st *unix.Stat_t, idx int32) error {
	size := st.Size
	if size == 0 || st.Blocks*512 >= roundBlock(size) {
		return nil
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return s.errorf(name, "open: %w", err)
	}
	defer unix.Close(fd)
	var ext []extent
	end := roundBlock(size)
	for pos := int64(0); pos < size; {
		d, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break
		}
		if err == unix.EINVAL || err == unix.EOPNOTSUPP {
			return nil // no hole support: all data
		}
		if err != nil {
			return s.errorf(name, "seek data: %w", err)
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return s.errorf(name, "seek hole: %w", err)
		}
		e := extent{d &^ (BlockSize - 1), min(roundBlock(h), end)}
		if len(ext) > 0 && ext[len(ext)-1].end >= e.off {
			ext[len(ext)-1].end = max(ext[len(ext)-1].end, e.end)
		} else if e.end > e.off {
			ext = append(ext, e)
		}
		pos = h
	}
	if len(ext) == 1 && ext[0].off == 0 && ext[0].end == end {
		return nil
	}
	if ext == nil {
		ext = []extent{} // all hole
	}
	s.nodes[idx].extents = ext
	return nil
}

func roundBlock(n int64) int64 { return (n + BlockSize - 1) &^ (BlockSize - 1) }

// xattrIndex maps a name to the kernel's short prefix index and suffix.
func xattrIndex(name string) (uint8, string, bool) {
	switch {
	case name == "system.posix_acl_access":
		return 2, "", true
	case name == "system.posix_acl_default":
		return 3, "", true
	case strings.HasPrefix(name, "user."):
		return 1, name[len("user."):], true
	case strings.HasPrefix(name, "trusted."):
		return 4, name[len("trusted."):], true
	case strings.HasPrefix(name, "security."):
		return 6, name[len("security."):], true
	}
	return 0, "", false
}

// dropXattr says which of overlayfs's own xattrs stay behind: only opaque
// survives, since it is layer content. The others (origin, redirect,
// metacopy, impure, ...) describe the builder's upper dir and would steer
// the receiver's overlay to lower layers that do not exist there.
func dropXattr(name string) bool {
	if name == "trusted.overlay.opaque" {
		return false
	}
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
}

// readXattrs reads and encodes the xattrs of name in dirfd, or of dirfd
// itself when name is "". Entries are sorted by name so copies of a tree
// give the same bytes.
func (s *scanner) readXattrs(dirfd int, name string) (string, error) {
	var path string
	var n int
	var err error
	for {
		if name == "" {
			n, err = unix.Flistxattr(dirfd, s.xlist)
		} else if n, err = listxattrat(dirfd, name, s.xlist); err == unix.ENOSYS {
			// Through the directory's fd, so the path stays short at any depth;
			// the l* call does not follow the entry itself.
			path = "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
			n, err = unix.Llistxattr(path, s.xlist)
		}
		if err != unix.EINTR {
			break
		}
	}
	if errors.Is(err, unix.ENOTSUP) {
		return "", nil
	}
	if err != nil {
		return "", s.errorf(name, "list xattrs: %w (is /proc mounted?)", err)
	}
	if n == 0 {
		return "", nil
	}
	var names []string
	for _, x := range strings.Split(string(s.xlist[:n]), "\x00") {
		if x != "" && !dropXattr(x) {
			names = append(names, x)
		}
	}
	if len(names) == 0 {
		return "", nil
	}
	slices.Sort(names)
	if name != "" && path == "" {
		path = "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
	}
	buf := make([]byte, xattrHdr, 256)
	for _, x := range names {
		idx, suffix, ok := xattrIndex(x)
		if !ok {
			return "", s.errorf(name, "xattr %q: EROFS stores only user.*, trusted.*, security.* and system.posix_acl_*; remove it from the layer", x)
		}
		if len(suffix) > 255 {
			return "", s.errorf(name, "xattr %q: name too long for EROFS", x)
		}
		var vn int
		for {
			if name == "" {
				vn, err = unix.Fgetxattr(dirfd, x, s.xval)
			} else {
				vn, err = unix.Lgetxattr(path, x, s.xval)
			}
			if err != unix.EINTR {
				break
			}
		}
		if err == unix.ENODATA {
			continue // removed since listing
		}
		if err != nil {
			return "", s.errorf(name, "read xattr %q: %w", x, err)
		}
		if vn > 0xffff {
			return "", s.errorf(name, "xattr %q: value is %d bytes, EROFS stores at most 65535", x, vn)
		}
		var h [4]byte
		h[0] = uint8(len(suffix))
		h[1] = idx
		binary.LittleEndian.PutUint16(h[2:], uint16(vn))
		buf = append(buf, h[:]...)
		buf = append(buf, suffix...)
		buf = append(buf, s.xval[:vn]...)
		for len(buf)%4 != 0 {
			buf = append(buf, 0)
		}
	}
	if len(buf) == xattrHdr {
		return "", nil
	}
	if (len(buf)-xattrHdr)/4+1 > 0xffff {
		return "", s.errorf(name, "xattrs take %d bytes, more than one EROFS inode can hold", len(buf))
	}
	return string(buf), nil
}
