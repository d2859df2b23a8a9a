package erofs

import (
	"bytes"
	"encoding/binary"
	"os"
	"strings"
	"testing"
)

// checkImage runs Check on the image at path, as a receiving node does.
func checkImage(t testing.TB, path string) error {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first := make([]byte, BlockSize)
	if _, err := f.ReadAt(first, 0); err != nil {
		t.Fatal(err)
	}
	sb, err := ParseSuperblock(first)
	if err != nil {
		return err
	}
	return Check(f, sb)
}

func checkBytes(t testing.TB, b []byte) error {
	t.Helper()
	sb, err := ParseSuperblock(b)
	if err != nil {
		return err
	}
	return Check(bytes.NewReader(b), sb)
}

// imageEditor changes an image of basicTree in place, as a tenant who
// pushes their own bytes would.
type imageEditor struct {
	t *testing.T
	b []byte
}

func (e imageEditor) rootNid() uint64 {
	return uint64(binary.LittleEndian.Uint16(e.b[superOffset+14:]))
}

// direntBlock is the offset of the root directory's entries, inline in
// its inode (one short block).
func (e imageEditor) direntBlock() int {
	off := int(e.rootNid()) * slotSize
	xattrs := 0
	if icount := int(binary.LittleEndian.Uint16(e.b[off+2:])); icount > 0 {
		xattrs = xattrHdr + (icount-1)*4
	}
	return off + inodeSize + xattrs
}

// dirent returns the offset of the entry name in the root directory.
func (e imageEditor) dirent(name string) int {
	e.t.Helper()
	le := binary.LittleEndian
	start := e.direntBlock()
	size := int(le.Uint64(e.b[int(e.rootNid())*slotSize+8:]))
	blk := e.b[start : start+size]
	count := int(le.Uint16(blk[8:])) / direntSize
	for i := range count {
		from, to := int(le.Uint16(blk[i*direntSize+8:])), len(blk)
		if i+1 < count {
			to = int(le.Uint16(blk[(i+1)*direntSize+8:]))
		}
		if string(blk[from:to]) == name {
			return start + i*direntSize
		}
	}
	e.t.Fatalf("no entry %q in the root directory", name)
	return 0
}

func (e imageEditor) nidOf(name string) uint64 {
	return binary.LittleEndian.Uint64(e.b[e.dirent(name):])
}

func (e imageEditor) inode(name string) int { return int(e.nidOf(name)) * slotSize }

// rename changes the name of a root directory entry in place, to one of
// the same length.
func (e imageEditor) rename(old, new string) {
	e.t.Helper()
	d := e.dirent(old)
	if len(old) != len(new) {
		e.t.Fatalf("rename %q to %q: not as many bytes", old, new)
	}
	nameAt := e.direntBlock() + int(binary.LittleEndian.Uint16(e.b[d+8:]))
	copy(e.b[nameAt:], new)
}

// replace replaces the one occurrence of old with new, of the same length.
func (e imageEditor) replace(old, new string) {
	e.t.Helper()
	if len(old) != len(new) || bytes.Count(e.b, []byte(old)) != 1 {
		e.t.Fatalf("%q occurs %d times in the image, want once, replaced by as many bytes", old, bytes.Count(e.b, []byte(old)))
	}
	copy(e.b[bytes.Index(e.b, []byte(old)):], new)
}

// TestCheckAcceptsWhatTheWriterWrites: writeImage checks every image the
// writer tests make (random trees, 2,100 levels, a sparse terabyte, overlay
// lowers); this one says so where it is looked for.
func TestCheckAcceptsWhatTheWriterWrites(t *testing.T) {
	requireTools(t)
	img, _ := writeImage(t, basicTree(t))
	if err := checkImage(t, img); err != nil {
		t.Fatalf("Check of the writer's own image: %v", err)
	}
}

// TestCheckRefusesTamperedImages (issue 33, finding 7): each image is the
// writer's, changed as a tenant who pushes their own bytes could; the
// kernel would mount several of them. Check must refuse each, naming
// why.
func TestCheckRefusesTamperedImages(t *testing.T) {
	requireTools(t)
	img, _ := writeImage(t, basicTree(t))
	orig, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	tests := []struct {
		name string
		edit func(e imageEditor)
		want string
	}{{
		name: "an overlay origin xattr",
		edit: func(e imageEditor) { e.replace("overlay.opaque", "overlay.origin") },
		want: `xattr "trusted.overlay.origin"`,
	}, {
		name: "an xattr past its area",
		edit: func(e imageEditor) {
			i := bytes.Index(e.b, []byte("overlay.opaque"))
			le.PutUint16(e.b[i-2:], 4000)
		},
		want: "past the inode's xattr area",
	}, {
		name: "shared xattrs",
		edit: func(e imageEditor) { e.b[int(e.rootNid())*slotSize+inodeSize+4] = 1 },
		want: "shared xattrs",
	}, {
		name: "a compressed inode",
		edit: func(e imageEditor) { le.PutUint16(e.b[e.inode("big"):], 1|3<<1) },
		want: "data layout 3",
	}, {
		name: "a compact inode",
		edit: func(e imageEditor) { le.PutUint16(e.b[e.inode("small"):], 0) },
		want: "extended inodes only",
	}, {
		name: "data outside the image",
		edit: func(e imageEditor) { le.PutUint32(e.b[e.inode("big")+16:], 1<<20) },
		want: "outside the image's data",
	}, {
		name: "an entry beyond the image",
		edit: func(e imageEditor) { le.PutUint64(e.b[e.dirent("small"):], 1<<40) },
		want: "outside the metadata area",
	}, {
		name: "a directory that contains its parent: a cycle",
		edit: func(e imageEditor) { le.PutUint64(e.b[e.dirent("d"):], e.rootNid()) },
		want: "reached twice",
	}, {
		name: "a second name of a directory, as a file",
		edit: func(e imageEditor) {
			d := e.nidOf("d")
			le.PutUint64(e.b[e.dirent("sock"):], d)
			e.b[e.dirent("sock")+10] = ftDir
		},
		want: "reached twice",
	}, {
		name: "a second name of a directory, as a socket",
		edit: func(e imageEditor) { le.PutUint64(e.b[e.dirent("sock"):], e.nidOf("d")) },
		want: `entry "sock" has file type 6`,
	}, {
		name: "a directory named as a file",
		edit: func(e imageEditor) { e.b[e.dirent("d")+10] = 1 },
		want: `entry "d" has file type 1`,
	}, {
		name: "a file named as a directory",
		edit: func(e imageEditor) { e.b[e.dirent("small")+10] = ftDir },
		want: "named as a directory",
	}, {
		name: "names out of order",
		edit: func(e imageEditor) { e.rename("small", "zmall") },
		want: "strictly sorted",
	}, {
		name: "a name with a slash",
		edit: func(e imageEditor) { e.rename("fifo", "f/fo") },
		want: `the name "f/fo"`,
	}, {
		name: "a name offset past the block",
		edit: func(e imageEditor) { le.PutUint16(e.b[e.dirent("big")+8:], 4000) },
		want: "has its name at",
	}, {
		name: "a wrong \"..\"",
		edit: func(e imageEditor) { le.PutUint64(e.b[e.dirent("..")+0:], e.nidOf("d")) },
		want: `entry ".."`,
	}, {
		name: "more inodes in the superblock than in the tree",
		edit: func(e imageEditor) {
			le.PutUint64(e.b[superOffset+16:], le.Uint64(e.b[superOffset+16:])+1)
		},
		want: "the superblock says",
	}, {
		name: "a symlink of a block",
		edit: func(e imageEditor) { le.PutUint64(e.b[e.inode("sym")+8:], BlockSize) },
		want: "symlink target of 4096 bytes",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := bytes.Clone(orig)
			tt.edit(imageEditor{t: t, b: b})
			err := checkBytes(t, b)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Check = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// FuzzCheck: whatever the bytes, Check returns; it never panics or runs
// away. Seeded with the writer's image of basicTree.
func FuzzCheck(f *testing.F) {
	requireTools(f)
	img, _ := writeImage(f, basicTreeIn(f, f.TempDir()))
	b, err := os.ReadFile(img)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b, 0, byte(0))
	f.Fuzz(func(t *testing.T, b []byte, at int, v byte) {
		if len(b) == 0 {
			return
		}
		b = bytes.Clone(b)
		b[(at%len(b)+len(b))%len(b)] ^= v
		sb, err := ParseSuperblock(b)
		if err != nil || sb.ImageBytes() != int64(len(b)) {
			return
		}
		_ = Check(bytes.NewReader(b), sb) // an error is fine; a panic or a hang is not
	})
}
