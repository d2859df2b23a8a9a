package erofs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
)

// Check reads the whole tree of an image whose superblock sb is and
// refuses anything this package's writer never produces, before the
// kernel mounts it: a registry's bytes are a tenant's bytes, and the
// digest only proves that they are what was pushed. It checks every
// inode reached from the root (an extended inode of a known type and
// data layout, its xattrs, its block map and its data inside the image),
// every directory (entries in bounds, names valid and strictly sorted, "."
// and ".." right, no directory reached twice, so no cycle) and the inode
// count. Overlayfs's own xattrs are refused but opaque: a redirect,
// origin or metacopy would steer the receiver's overlay to lower layers
// that are not the image's.
//
// The work is bounded by the image's size: every inode is read once, and
// the records and directory blocks read may add up to the image's size at
// most, as they do in an image whose parts do not overlap.
func Check(r io.ReaderAt, sb Superblock) error {
	c := &checker{r: r, size: sb.ImageBytes(), blocks: sb.Blocks, seen: map[uint64]uint8{}, cache: map[int64][]byte{}}
	head, err := c.block(0)
	if err != nil {
		return err
	}
	root := uint64(binary.LittleEndian.Uint16(head[superOffset+14:]))
	if err := c.walk(root); err != nil {
		return err
	}
	if uint64(len(c.seen)) != sb.Inodes {
		return fmt.Errorf("erofs: the tree holds %d inodes, the superblock says %d: the image was altered", len(c.seen), sb.Inodes)
	}
	return nil
}

type checker struct {
	r      io.ReaderAt
	size   int64
	blocks uint32
	seen   map[uint64]uint8 // nids checked, with their dirent file type
	cache  map[int64][]byte
	// spent counts the bytes of inode records and directory blocks read.
	spent int64
}

// spend counts n bytes read for inode nid. In this package's images no
// two records or directory blocks overlap, so they add up to the image's
// size at most; a crafted image whose directories share blocks or whose
// records overlap would otherwise cost a read of them for each.
func (c *checker) spend(nid uint64, n int64) error {
	c.spent += n
	if c.spent > c.size {
		return c.errorf(nid, "the image's records and directories take more than its %d bytes: they overlap", c.size)
	}
	return nil
}

// inode is what Check reads of an inode record.
type inode struct {
	nid     uint64
	off     int64 // of the record
	mode    uint32
	layout  uint8
	size    int64
	iu      uint32
	xattrs  int64 // bytes of inline xattrs
	tailOff int64 // where an inline tail or block map starts
}

func (n *inode) typ() uint32 { return n.mode & 0o170000 }

func (c *checker) errorf(nid uint64, format string, args ...any) error {
	return fmt.Errorf("erofs: inode %d: "+format, append([]any{nid}, args...)...)
}

// block returns block b of the image; blocks are cached, as directories
// and their children's inodes share metadata blocks.
func (c *checker) block(b int64) ([]byte, error) {
	if buf, ok := c.cache[b]; ok {
		return buf, nil
	}
	if b < 0 || b >= int64(c.blocks) {
		return nil, fmt.Errorf("erofs: block %d is outside the image's %d blocks", b, c.blocks)
	}
	buf := make([]byte, BlockSize)
	if _, err := c.r.ReadAt(buf, b*BlockSize); err != nil {
		return nil, fmt.Errorf("erofs: read block %d: %w", b, err)
	}
	if len(c.cache) >= 4096 {
		clear(c.cache)
	}
	c.cache[b] = buf
	return buf, nil
}

// bytesAt reads n bytes at off, which may span blocks.
func (c *checker) bytesAt(off, n int64) ([]byte, error) {
	if off < 0 || n < 0 || off+n > c.size {
		return nil, fmt.Errorf("erofs: %d bytes at %d are outside the image's %d bytes", n, off, c.size)
	}
	out := make([]byte, 0, n)
	for n > 0 {
		blk, err := c.block(off / BlockSize)
		if err != nil {
			return nil, err
		}
		o := off % BlockSize
		k := min(BlockSize-o, n)
		out = append(out, blk[o:o+k]...)
		off += k
		n -= k
	}
	return out, nil
}

// inode reads and checks the inode at nid: its format, type, xattrs and
// where its data lies.
func (c *checker) inode(nid uint64) (*inode, error) {
	off := int64(nid) * slotSize
	if nid > uint64(c.size)/slotSize || off < metaStart {
		return nil, c.errorf(nid, "outside the metadata area of the image")
	}
	b, err := c.bytesAt(off, inodeSize)
	if err != nil {
		return nil, c.errorf(nid, "%w", err)
	}
	le := binary.LittleEndian
	format := le.Uint16(b[0:])
	n := &inode{nid: nid, off: off, mode: uint32(le.Uint16(b[4:])), layout: uint8(format>>1) & 7,
		size: int64(le.Uint64(b[8:])), iu: le.Uint32(b[16:])}
	if format&1 != 1 || format>>4 != 0 {
		return nil, c.errorf(nid, "format %#x: images of this package have extended inodes only", format)
	}
	if n.size < 0 {
		return nil, c.errorf(nid, "size %d", n.size)
	}
	if icount := int64(le.Uint16(b[2:])); icount > 0 {
		n.xattrs = xattrHdr + (icount-1)*4
	}
	n.tailOff = off + inodeSize + n.xattrs
	if err := c.spend(nid, inodeSize+n.xattrs); err != nil {
		return nil, err
	}
	if err := c.checkXattrs(n); err != nil {
		return nil, err
	}
	if err := c.checkType(n); err != nil {
		return nil, err
	}
	return n, c.checkData(n)
}

// checkType allows each file type only the layouts the writer gives it.
func (c *checker) checkType(n *inode) error {
	ok := false
	switch n.typ() {
	case 0o040000, 0o120000: // directory, symlink
		ok = n.layout == layoutFlatPlain || n.layout == layoutFlatInline
	case 0o100000:
		ok = n.layout == layoutFlatPlain || n.layout == layoutChunkBased
	case 0o020000, 0o060000, 0o010000, 0o140000: // devices, fifo, socket
		ok = n.layout == layoutFlatPlain && n.size == 0
	default:
		return c.errorf(n.nid, "mode %#o is no file type", n.mode)
	}
	if !ok {
		return c.errorf(n.nid, "mode %#o with data layout %d and size %d: images of this package never hold that", n.mode, n.layout, n.size)
	}
	switch {
	case n.typ() == 0o040000 && n.size == 0:
		return c.errorf(n.nid, "a directory without entries")
	case n.typ() == 0o120000 && (n.size == 0 || n.size >= BlockSize):
		return c.errorf(n.nid, "a symlink target of %d bytes", n.size)
	}
	return nil
}

// checkData checks that the inode's data blocks, inline tail or block map
// lie inside the image; a record that fits in a block must not cross one.
func (c *checker) checkData(n *inode) error {
	if n.typ() != 0o100000 && n.typ() != 0o040000 && n.typ() != 0o120000 {
		return nil
	}
	rec := inodeSize + n.xattrs
	switch n.layout {
	case layoutFlatPlain:
		if err := c.checkBlocks(n, n.iu, (n.size+BlockSize-1)/BlockSize); err != nil {
			return err
		}
	case layoutFlatInline:
		tail := n.size % BlockSize
		if tail == 0 {
			return c.errorf(n.nid, "an inline tail of 0 bytes")
		}
		if err := c.spend(n.nid, tail); err != nil {
			return err
		}
		rec += tail
		if rec > BlockSize {
			return c.errorf(n.nid, "an inline tail that does not fit in the inode's block")
		}
		if err := c.checkBlocks(n, n.iu, n.size/BlockSize); err != nil {
			return err
		}
	case layoutChunkBased:
		bits := uint8(n.iu)
		if n.iu&^0x1f != 0 || bits > maxChunkBits {
			return c.errorf(n.nid, "chunk format %#x: images of this package use block maps of 4 KiB << 0..%d chunks", n.iu, maxChunkBits)
		}
		chunks := numChunks(n.size, bits)
		rec += 4 * chunks
		if err := c.spend(n.nid, 4*chunks); err != nil {
			return err
		}
		if err := c.checkBlockMap(n, bits, chunks); err != nil {
			return err
		}
	}
	if rec <= BlockSize && n.off%BlockSize+rec > BlockSize {
		return c.errorf(n.nid, "its record of %d bytes crosses a block boundary", rec)
	}
	if n.off+rec > c.size {
		return c.errorf(n.nid, "its record ends past the image")
	}
	return nil
}

func (c *checker) checkBlocks(n *inode, addr uint32, count int64) error {
	if count > 0 && (addr == 0 || int64(addr)+count > int64(c.blocks)) {
		return c.errorf(n.nid, "%d data blocks at block %d: outside the image's data (%d blocks)", count, addr, c.blocks)
	}
	return nil
}

// checkBlockMap reads the map an entry at a time: entries are 4-byte
// aligned, so none crosses a block.
func (c *checker) checkBlockMap(n *inode, bits uint8, chunks int64) error {
	if n.tailOff+4*chunks > c.size {
		return c.errorf(n.nid, "a block map of %d chunks past the image's end", chunks)
	}
	for i := range chunks {
		off := n.tailOff + 4*i
		blk, err := c.block(off / BlockSize)
		if err != nil {
			return c.errorf(n.nid, "block map: %w", err)
		}
		addr := binary.LittleEndian.Uint32(blk[off%BlockSize:])
		if addr == nullAddr {
			continue
		}
		if err := c.checkBlocks(n, addr, chunkBytes(n.size, bits, i)/BlockSize); err != nil {
			return err
		}
	}
	return nil
}

// checkXattrs reads the inline xattrs: no shared ones, each entry inside
// the area, a known prefix, and of overlayfs's own only opaque.
func (c *checker) checkXattrs(n *inode) error {
	if n.xattrs == 0 {
		return nil
	}
	x, err := c.bytesAt(n.off+inodeSize, n.xattrs)
	if err != nil {
		return c.errorf(n.nid, "xattrs: %w", err)
	}
	if x[4] != 0 {
		return c.errorf(n.nid, "%d shared xattrs: images of this package keep xattrs inline", x[4])
	}
	for p := int64(xattrHdr); p < n.xattrs; {
		if p+4 > n.xattrs {
			return c.errorf(n.nid, "an xattr entry past the inode's xattr area")
		}
		nameLen, index := int64(x[p]), x[p+1]
		valueLen := int64(binary.LittleEndian.Uint16(x[p+2:]))
		end := p + 4 + nameLen + valueLen
		if end > n.xattrs {
			return c.errorf(n.nid, "an xattr entry of %d bytes past the inode's xattr area", end-p)
		}
		name := string(x[p+4 : p+4+nameLen])
		if err := checkXattrName(index, name); err != nil {
			return c.errorf(n.nid, "%w", err)
		}
		p = (end + 3) &^ 3
	}
	return nil
}

func checkXattrName(index uint8, suffix string) error {
	var full string
	switch index {
	case 1:
		full = "user." + suffix
	case 2, 3:
		if suffix != "" {
			return fmt.Errorf("a POSIX ACL xattr with a name suffix %q", suffix)
		}
		return nil
	case 4:
		full = "trusted." + suffix
	case 6:
		full = "security." + suffix
	default:
		return fmt.Errorf("xattr prefix index %d: images of this package use user., trusted., security. and POSIX ACLs only", index)
	}
	switch {
	case suffix == "" || strings.IndexByte(suffix, 0) >= 0:
		return fmt.Errorf("xattr %q: an empty name or one with a NUL byte", full)
	case dropXattr(full):
		return fmt.Errorf("xattr %q: overlayfs's own xattrs describe a builder's upper dir; a layer image carries only trusted.overlay.opaque", full)
	}
	return nil
}

// ftDir is a directory's dirent file type.
const ftDir = 2

// walk checks every directory from the root and everything in them. It
// keeps its own stack, as trees are deeper than PATH_MAX (the writer
// takes any depth), and marks a directory when it is first named, so a
// second name (a hard-linked directory, a cycle) is refused.
func (c *checker) walk(root uint64) error {
	type dirRef struct{ nid, parent uint64 }
	c.seen[root] = ftDir
	stack := []dirRef{{root, root}}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		err := c.dir(d.nid, d.parent, func(child uint64) error {
			if _, ok := c.seen[child]; ok {
				return c.errorf(child, "a directory reached twice: a hard-linked directory or a cycle")
			}
			c.seen[child] = ftDir
			stack = append(stack, dirRef{child, d.nid})
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// dir checks the directory at nid, whose parent is parent, and the
// inodes of its entries but subdirectories, which it hands to subdir.
func (c *checker) dir(nid, parent uint64, subdir func(uint64) error) error {
	n, err := c.inode(nid)
	if err != nil {
		return err
	}
	if n.typ() != 0o040000 {
		return c.errorf(nid, "named as a directory, but of mode %#o", n.mode)
	}
	var prev string
	dots := 0
	err = c.entries(n, func(name string, child uint64, ftype uint8) error {
		if prev != "" && name <= prev {
			return c.errorf(nid, "entry %q after %q: entries must be strictly sorted", name, prev)
		}
		prev = name
		switch {
		case name == "." || name == "..":
			want := map[string]uint64{".": nid, "..": parent}[name]
			if child != want || ftype != ftDir {
				return c.errorf(nid, "entry %q names inode %d of type %d, want directory inode %d", name, child, ftype, want)
			}
			dots++
			return nil
		case ftype == ftDir:
			return subdir(child)
		}
		return c.file(nid, name, child, ftype)
	})
	if err == nil && dots != 2 {
		err = c.errorf(nid, "a directory without its \".\" and \"..\" entries")
	}
	return err
}

// file checks the inode of an entry that is not a directory, once: a
// hard link's inode was checked at its first name, and its type then
// must match (a directory named as a file would be a second name of it).
func (c *checker) file(dir uint64, name string, nid uint64, ftype uint8) error {
	want, ok := c.seen[nid]
	if !ok {
		n, err := c.inode(nid)
		if err != nil {
			return fmt.Errorf("entry %q: %w", name, err)
		}
		want = fileType(n.mode)
		c.seen[nid] = want
	}
	if ftype != want {
		return c.errorf(dir, "entry %q has file type %d, its inode %d is of type %d", name, ftype, nid, want)
	}
	return nil
}

// entries calls fn for each entry of directory n, in on-disk order.
func (c *checker) entries(n *inode, fn func(name string, nid uint64, ftype uint8) error) error {
	for start := int64(0); start < n.size; start += BlockSize {
		blk, err := c.dirBlock(n, start)
		if err != nil {
			return err
		}
		if err := c.blockEntries(n.nid, blk, fn); err != nil {
			return err
		}
	}
	return nil
}

// dirBlock returns the directory's bytes from start, one block at most:
// from its data blocks, or its inline tail.
func (c *checker) dirBlock(n *inode, start int64) ([]byte, error) {
	length := min(BlockSize, n.size-start)
	if n.layout == layoutFlatInline && start == n.size/BlockSize*BlockSize {
		return c.bytesAt(n.tailOff, length) // counted with its record
	}
	if err := c.spend(n.nid, length); err != nil {
		return nil, err
	}
	return c.bytesAt(int64(n.iu)*BlockSize+start, length)
}

// blockEntries parses one block of dirents: the first one's name offset
// gives the count, names follow in order, the last one ends at the block's
// end or its first NUL.
func (c *checker) blockEntries(dir uint64, blk []byte, fn func(string, uint64, uint8) error) error {
	le := binary.LittleEndian
	if len(blk) < direntSize {
		return c.errorf(dir, "a directory block of %d bytes", len(blk))
	}
	first := int(le.Uint16(blk[8:]))
	if first < direntSize || first%direntSize != 0 || first >= len(blk) {
		return c.errorf(dir, "a directory block whose first name is at %d", first)
	}
	count := first / direntSize
	for i := range count {
		d := blk[i*direntSize:]
		from, to := int(le.Uint16(d[8:])), len(blk)
		if i+1 < count {
			to = int(le.Uint16(blk[(i+1)*direntSize+8:]))
		}
		if from < first || to > len(blk) || from >= to {
			return c.errorf(dir, "directory entry %d has its name at %d..%d of a %d-byte block", i, from, to, len(blk))
		}
		name := blk[from:to]
		if i+1 == count {
			if z := bytes.IndexByte(name, 0); z >= 0 {
				name = name[:z]
			}
		}
		if len(name) == 0 || len(name) > maxNameLen || bytes.ContainsAny(name, "/\x00") {
			return c.errorf(dir, "directory entry %d has the name %q", i, name)
		}
		if err := fn(string(name), le.Uint64(d[0:]), d[10]); err != nil {
			return err
		}
	}
	return nil
}
