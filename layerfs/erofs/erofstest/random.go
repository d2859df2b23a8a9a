package erofstest

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// blockSize is erofs.BlockSize: files of several blocks, and a tail
// shorter than one, take the writer's other paths.
const blockSize = 4096

// DeepDepth is the depth of the path TestDeepTree and WithDeepPath make:
// far past PATH_MAX, so only code that walks by directory fd gets through.
const DeepDepth = 2100

// TreeOption changes what RandomTree generates.
type TreeOption func(*treeOptions)

type treeOptions struct{ deep int }

// WithDeepPath adds DeepPath's chain of levels directories to the tree.
func WithDeepPath(levels int) TreeOption {
	return func(o *treeOptions) { o.deep = levels }
}

// RandomTree fills the empty directory dir, and dir itself, with a random
// overlay-format layer: every file kind (regular, sparse with holes at
// the start, middle or end, hardlinks, symlinks, fifos, sockets, character
// and block devices, overlay whiteouts), opaque directories, xattrs of
// every namespace the writer stores plus overlay's own that it drops,
// set-id and sticky bits, owners, random mtimes, and names that are 255
// bytes, not UTF-8, ".wh."-prefixed plain files, or sort before ".".
// A directory named "wide" has dirents over several blocks. The same
// seed gives the same tree, so a failure names its seed.
func RandomTree(t testing.TB, dir string, seed uint64, opts ...TreeOption) {
	t.Helper()
	var o treeOptions
	for _, opt := range opts {
		opt(&o)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	Must(t, err, "open")
	defer unix.Close(fd)
	g := &gen{t: t, r: rand.New(rand.NewPCG(seed, 7))}
	g.dir(fd, 0)
	g.wide(fd)
	if o.deep > 0 {
		deepPath(t, fd, o.deep)
	}
	g.meta(fd, "", unix.S_IFDIR)
}

// DeepPath makes levels nested directories named "level-dir" under dir,
// with a file "f" every 500 levels and a file "bottom" at the end. It
// works one openat at a time, as a path that long cannot be used.
func DeepPath(t testing.TB, dir string, levels int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	Must(t, err, "open")
	defer unix.Close(fd)
	deepPath(t, fd, levels)
}

func deepPath(t testing.TB, dfd, levels int) {
	t.Helper()
	fd, err := unix.Dup(dfd)
	Must(t, err, "dup")
	// Closed on every path, or a failed test leaves a mount busy.
	defer func() { unix.Close(fd) }()
	for i := range levels {
		Must(t, unix.Mkdirat(fd, "level-dir", 0o755), "mkdir")
		nfd, err := unix.Openat(fd, "level-dir", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		Must(t, err, "open")
		if i%500 == 0 {
			Mkfile(t, nfd, "f", []byte("x"), 0o644)
		}
		unix.Close(fd)
		fd = nfd
	}
	Mkfile(t, fd, "bottom", []byte("deep"), 0o644)
}

type gen struct {
	t     testing.TB
	r     *rand.Rand
	files []link // regular files in open ancestor directories
}

type link struct {
	dfd  int
	name string
}

func (g *gen) name(taken map[string]bool) string {
	for {
		var b []byte
		switch g.r.IntN(12) {
		case 0: // longest allowed
			b = make([]byte, 255)
			for i := range b {
				b[i] = 'a' + byte(g.r.IntN(26))
			}
		case 1:
			b = append([]byte(".wh."), g.word()...)
		case 2: // not UTF-8
			b = []byte{0xff, 0xfe, byte(0x80 + g.r.IntN(0x7f)), 'x'}
		case 3: // sorts before "."
			b = append([]byte{" !#-"[g.r.IntN(4)]}, g.word()...)
		default:
			b = g.word()
		}
		s := string(b)
		if s != "." && s != ".." && !taken[s] {
			taken[s] = true
			return s
		}
	}
}

func (g *gen) word() []byte {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789._-~"
	b := make([]byte, 1+g.r.IntN(12))
	for i := range b {
		b[i] = chars[g.r.IntN(len(chars))]
	}
	return b
}

func (g *gen) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.r.Uint32())
	}
	return b
}

func (g *gen) dir(fd, depth int) {
	taken := map[string]bool{}
	n := 2 + g.r.IntN(10)
	mark := len(g.files)
	for range n {
		name := g.name(taken)
		kind := g.r.IntN(16)
		if depth >= 4 && kind >= 13 {
			kind = 0
		}
		switch kind {
		case 0, 1, 2:
			Mkfile(g.t, fd, name, g.bytes(g.r.IntN(9000)), 0o644)
			g.files = append(g.files, link{fd, name})
		case 3:
			Mkfile(g.t, fd, name, g.bytes(blockSize*(1+g.r.IntN(6))+g.r.IntN(2)*g.r.IntN(blockSize)), 0o644)
			g.files = append(g.files, link{fd, name})
		case 4:
			g.sparse(fd, name)
			g.files = append(g.files, link{fd, name})
		case 5:
			if len(g.files) == 0 {
				Mkfile(g.t, fd, name, nil, 0o644)
				g.files = append(g.files, link{fd, name})
				break
			}
			l := g.files[g.r.IntN(len(g.files))]
			Must(g.t, unix.Linkat(l.dfd, l.name, fd, name, 0), "link")
			continue // metadata belongs to the first name
		case 6:
			target := g.bytes(1 + g.r.IntN(200))
			if g.r.IntN(4) == 0 {
				target = g.bytes(4000 + g.r.IntN(95)) // with xattrs, too big to inline
			}
			for i, c := range target {
				if c == 0 {
					target[i] = 'z'
				}
			}
			Must(g.t, unix.Symlinkat(string(target), fd, name), "symlink")
		case 7:
			Must(g.t, unix.Mknodat(fd, name, unix.S_IFIFO|0o644, 0), "fifo")
		case 8:
			Must(g.t, unix.Mknodat(fd, name, unix.S_IFSOCK|0o644, 0), "socket")
		case 9:
			typ := uint32(unix.S_IFCHR)
			if g.r.IntN(2) == 0 {
				typ = unix.S_IFBLK
			}
			dev := unix.Mkdev(uint32(g.r.IntN(4096)), uint32(g.r.IntN(1<<20)))
			Must(g.t, unix.Mknodat(fd, name, typ|0o600, int(dev)), "mknod")
		case 10:
			Must(g.t, unix.Mknodat(fd, name, unix.S_IFCHR, 0), "whiteout")
		default:
			Must(g.t, unix.Mkdirat(fd, name, 0o755), "mkdir")
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			Must(g.t, err, "open")
			if g.r.IntN(3) == 0 {
				Setxattr(g.t, cfd, "", "trusted.overlay.opaque", "y")
			}
			g.dir(cfd, depth+1)
			g.meta(cfd, "", unix.S_IFDIR)
			unix.Close(cfd)
			continue
		}
		var st unix.Stat_t
		Must(g.t, unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW), "stat")
		g.meta(fd, name, st.Mode&unix.S_IFMT)
	}
	g.files = g.files[:mark]
}

// wide makes a directory whose dirents span several blocks.
func (g *gen) wide(fd int) {
	Must(g.t, unix.Mkdirat(fd, "wide", 0o755), "mkdir")
	cfd, err := unix.Openat(fd, "wide", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	Must(g.t, err, "open")
	defer unix.Close(cfd)
	taken := map[string]bool{}
	for range 50 + g.r.IntN(400) {
		Mkfile(g.t, cfd, g.name(taken), nil, 0o644)
	}
	g.meta(cfd, "", unix.S_IFDIR)
}

// sparse makes a file with holes at the start, middle or end, or only holes.
func (g *gen) sparse(fd int, name string) {
	f, err := unix.Openat(fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
	Must(g.t, err, "create")
	defer unix.Close(f)
	size := int64(64<<10 + g.r.IntN(256<<10))
	Must(g.t, unix.Ftruncate(f, size), "truncate")
	var offs []int64
	switch g.r.IntN(5) {
	case 0: // hole at start
		offs = []int64{size - 10000}
	case 1: // hole in the middle
		offs = []int64{0, size - 5000}
	case 2: // hole at end
		offs = []int64{0}
	case 3: // unaligned pieces
		offs = []int64{int64(g.r.IntN(int(size / 2))), size/2 + int64(g.r.IntN(int(size/4)))}
	case 4: // all hole
	}
	for _, off := range offs {
		_, err := unix.Pwrite(f, g.bytes(int(min(int64(1+g.r.IntN(9000)), size-off))), off)
		Must(g.t, err, "pwrite")
	}
}

// meta gives an entry random owner, mode, xattrs and mtime.
func (g *gen) meta(fd int, name string, typ uint32) {
	flags := unix.AT_SYMLINK_NOFOLLOW
	target := name
	if name == "" {
		target = "."
	}
	Must(g.t, unix.Fchownat(fd, target, g.r.IntN(200000), g.r.IntN(200000), flags), "chown")
	if typ != unix.S_IFLNK {
		Must(g.t, unix.Fchmodat(fd, target, uint32(g.r.IntN(0o7777+1)), 0), "chmod")
	}
	if typ == unix.S_IFREG || typ == unix.S_IFDIR || (typ == unix.S_IFLNK && g.r.IntN(2) == 0) {
		for range g.r.IntN(4) {
			switch g.r.IntN(6) {
			case 0:
				if typ != unix.S_IFLNK {
					Setxattr(g.t, fd, name, "user."+string(g.word()), string(g.bytes(g.r.IntN(100))))
				}
			case 1:
				Setxattr(g.t, fd, name, "trusted."+string(g.word()), string(g.bytes(g.r.IntN(300))))
			case 2:
				Setxattr(g.t, fd, name, "security."+string(g.word()), string(g.bytes(g.r.IntN(50))))
			case 3: // dropped by the writer
				Setxattr(g.t, fd, name, "trusted.overlay.origin", "x")
				if typ != unix.S_IFLNK {
					Setxattr(g.t, fd, name, "user.overlay.redirect", "/y")
				}
			case 4:
				if typ != unix.S_IFLNK {
					Setxattr(g.t, fd, name, "system.posix_acl_access", string(acl(uint32(g.r.IntN(60000)))))
				}
			case 5:
				if typ == unix.S_IFDIR {
					Setxattr(g.t, fd, name, "system.posix_acl_default", string(acl(uint32(g.r.IntN(60000)))))
				}
			}
		}
	}
	ts := []unix.Timespec{
		{Sec: int64(g.r.IntN(2e9)), Nsec: int64(g.r.IntN(1e9))},
		{Sec: int64(g.r.IntN(2e9)), Nsec: int64(g.r.IntN(1e9))},
	}
	Must(g.t, unix.UtimesNanoAt(fd, target, ts, flags), "utimes")
}

// acl encodes a valid POSIX ACL xattr with one named user.
func acl(uid uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range []struct {
		tag, perm uint16
		id        uint32
	}{{1, 6, 0xffffffff}, {2, 4, uid}, {4, 4, 0xffffffff}, {0x10, 6, 0xffffffff}, {0x20, 4, 0xffffffff}} {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// --- tree building, by fd so depth is unbounded ---

// Mkfile creates name in the directory dfd with data and mode.
func Mkfile(t testing.TB, dfd int, name string, data []byte, mode uint32) {
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

// Must fails the test with what when err is set.
func Must(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Setxattr sets an xattr on name in the directory dfd, without
// following a symlink.
func Setxattr(t testing.TB, dfd int, name, key, val string) {
	t.Helper()
	Must(t, unix.Lsetxattr(fdPath(dfd, name), key, []byte(val), 0), fmt.Sprintf("setxattr %s %s", name, key))
}

// fdPath names name in the directory dfd (dfd itself if name is "")
// through /proc, so the path stays short at any depth.
func fdPath(dfd int, name string) string {
	if name == "" {
		return "/proc/self/fd/" + strconv.Itoa(dfd) + "/."
	}
	return "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + name
}
