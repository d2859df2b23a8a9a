package erofs

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/unix"
)

// Write writes the tree at dir as an EROFS image to w, sequentially: w is
// typically a compressor and a hasher, so the image is never seeked in or
// held whole. It reads the tree twice: once to record every inode in a
// compact table (names, stat, xattrs, data ranges; no file contents), then
// again to copy file contents in the order the layout placed them.
// The tree must not change while it is written; a file found changed is an
// error, not a silently wrong image.
func Write(ctx context.Context, dir string, w io.Writer) (Stats, error) {
	s, err := scanTree(ctx, dir)
	if err != nil {
		return Stats{}, err
	}
	im, err := layout(s.nodes)
	if err != nil {
		return Stats{}, err
	}
	e := &emitter{w: w, buf: make([]byte, 1<<20)}
	if err := im.emitMeta(e); err != nil {
		return Stats{}, err
	}
	if err := e.padTo(im.dataStart); err != nil {
		return Stats{}, err
	}

	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("erofs: reopen layer directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	d := &dataWriter{ctx: ctx, im: im, e: e}
	// Directories' and symlinks' blocks first, from memory, as layout
	// placed them; then the files', walking the tree.
	for _, i := range im.order {
		if n := &im.nodes[i]; !n.isReg() {
			n.emitted = true
			if err := d.node(fd, "", i); err != nil {
				return Stats{}, err
			}
		}
	}
	if err := d.dir(fd, 0); err != nil {
		return Stats{}, err
	}
	end := int64(im.blocks) * BlockSize
	if e.off != end {
		return Stats{}, fmt.Errorf("erofs: internal error: image ends at byte %d, layout says %d", e.off, end)
	}
	if err := e.flush(); err != nil {
		return Stats{}, err
	}
	return Stats{ImageBytes: end, Inodes: int64(len(im.nodes)), DataBytes: d.dataBytes}, nil
}

// emitter buffers the image in one reused buffer and reads file contents
// straight into it, so file data is copied once on its way to w.
type emitter struct {
	w   io.Writer
	buf []byte
	n   int
	off int64 // image bytes emitted so far, buffered included
}

func (e *emitter) flush() error {
	if e.n == 0 {
		return nil
	}
	_, err := e.w.Write(e.buf[:e.n])
	e.n = 0
	if err != nil {
		return fmt.Errorf("erofs: write image: %w", err)
	}
	return nil
}

func (e *emitter) write(p []byte) error {
	for len(p) > 0 {
		if e.n == len(e.buf) {
			if err := e.flush(); err != nil {
				return err
			}
		}
		c := copy(e.buf[e.n:], p)
		e.n += c
		e.off += int64(c)
		p = p[c:]
	}
	return nil
}

func (e *emitter) writeString(s string) error {
	for len(s) > 0 {
		if e.n == len(e.buf) {
			if err := e.flush(); err != nil {
				return err
			}
		}
		c := copy(e.buf[e.n:], s)
		e.n += c
		e.off += int64(c)
		s = s[c:]
	}
	return nil
}

func (e *emitter) u32(v uint32) error {
	if len(e.buf)-e.n < 4 {
		if err := e.flush(); err != nil {
			return err
		}
	}
	binary.LittleEndian.PutUint32(e.buf[e.n:], v)
	e.n += 4
	e.off += 4
	return nil
}

func (e *emitter) padTo(off int64) error {
	if off < e.off {
		return fmt.Errorf("erofs: internal error: layout overlaps at byte %d (already at %d)", off, e.off)
	}
	for e.off < off {
		if e.n == len(e.buf) {
			if err := e.flush(); err != nil {
				return err
			}
		}
		c := int(min(int64(len(e.buf)-e.n), off-e.off))
		clear(e.buf[e.n : e.n+c])
		e.n += c
		e.off += int64(c)
	}
	return nil
}

// readFile copies n bytes at off from fd into the image.
func (e *emitter) readFile(fd int, off, n int64) error {
	for n > 0 {
		if e.n == len(e.buf) {
			if err := e.flush(); err != nil {
				return err
			}
		}
		space := e.buf[e.n : e.n+int(min(int64(len(e.buf)-e.n), n))]
		r, err := unix.Pread(fd, space, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if r == 0 {
			return io.ErrUnexpectedEOF
		}
		e.n += r
		e.off += int64(r)
		off += int64(r)
		n -= int64(r)
	}
	return nil
}

// emitMeta writes block 0 (superblock) and the metadata area.
func (im *image) emitMeta(e *emitter) error {
	var sb [superSize]byte
	putSuperblock(sb[:], uint16(im.nodes[0].nid), uint64(len(im.nodes)), im.blocks, im.incompat)
	if err := e.padTo(superOffset); err != nil {
		return err
	}
	if err := e.write(sb[:]); err != nil {
		return err
	}
	var ib [inodeSize]byte
	tail := make([]byte, BlockSize)
	for ino, i := range im.order {
		n := &im.nodes[i]
		if err := e.padTo(int64(n.nid) * slotSize); err != nil {
			return err
		}
		im.putInode(ib[:], i, uint32(ino+1))
		if err := e.write(ib[:]); err != nil {
			return err
		}
		if err := e.writeString(n.xattrs); err != nil {
			return err
		}
		switch {
		case n.layout == layoutFlatInline && n.isLink():
			err := e.writeString(n.target[len(n.target)-int(n.size%BlockSize):])
			if err != nil {
				return err
			}
		case n.layout == layoutFlatInline && n.isDir():
			var last []byte
			im.dirBlocks(i, tail, func(b []byte) error { last = b; return nil })
			if err := e.write(last); err != nil {
				return err
			}
		case n.layout == layoutChunkBased:
			if err := im.putBlockMap(e, n); err != nil {
				return err
			}
		}
	}
	return nil
}

func (im *image) putBlockMap(e *emitter, n *node) error {
	addr := n.blkaddr
	next := int64(0)
	for c := range storedChunks(n.extents, n.chunkBits) {
		for ; next < c; next++ {
			if err := e.u32(nullAddr); err != nil {
				return err
			}
		}
		if err := e.u32(addr); err != nil {
			return err
		}
		addr += uint32(chunkBytes(n.size, n.chunkBits, c) / BlockSize)
		next = c + 1
	}
	for total := numChunks(n.size, n.chunkBits); next < total; next++ {
		if err := e.u32(nullAddr); err != nil {
			return err
		}
	}
	return nil
}

func (im *image) putInode(b []byte, i int32, ino uint32) {
	n := &im.nodes[i]
	clear(b)
	le := binary.LittleEndian
	le.PutUint16(b[0:], 1|uint16(n.layout)<<1) // extended inode
	if len(n.xattrs) > 0 {
		le.PutUint16(b[2:], uint16((len(n.xattrs)-xattrHdr)/4+1))
	}
	le.PutUint16(b[4:], uint16(n.mode))
	le.PutUint64(b[8:], uint64(n.size))
	switch {
	case n.mode&unix.S_IFMT == unix.S_IFCHR || n.mode&unix.S_IFMT == unix.S_IFBLK:
		le.PutUint32(b[16:], n.rdev)
	case n.layout == layoutChunkBased:
		le.PutUint16(b[16:], uint16(n.chunkBits))
	default:
		le.PutUint32(b[16:], n.blkaddr)
	}
	le.PutUint32(b[20:], ino)
	le.PutUint32(b[24:], n.uid)
	le.PutUint32(b[28:], n.gid)
	le.PutUint64(b[32:], uint64(n.mtime))
	le.PutUint32(b[40:], n.mtimeNs)
	le.PutUint32(b[44:], n.nlink)
}

// dirBlocks builds a directory's dirent blocks in buf (one block reused)
// and hands each to fn: all but the last zero-padded to a block, the last
// cut at its used bytes. Each block starts with its dirents; the first
// dirent's nameoff tells the kernel how many there are, and names follow
// without terminators.
func (im *image) dirBlocks(d int32, buf []byte, fn func([]byte) error) error {
	type ent struct {
		name string
		idx  int32
	}
	var ents []ent
	used := 0
	flush := func(last bool) error {
		nameoff := len(ents) * direntSize
		for k, en := range ents {
			c := &im.nodes[en.idx]
			b := buf[k*direntSize:]
			binary.LittleEndian.PutUint64(b[0:], c.nid)
			binary.LittleEndian.PutUint16(b[8:], uint16(nameoff))
			b[10] = fileType(c.mode)
			b[11] = 0
			nameoff += copy(buf[nameoff:], en.name)
		}
		if last {
			return fn(buf[:nameoff])
		}
		clear(buf[nameoff:BlockSize])
		return fn(buf[:BlockSize])
	}
	for name, idx := range im.dirents(d) {
		sz := direntSize + len(name)
		if used+sz > BlockSize {
			if err := flush(false); err != nil {
				return err
			}
			ents, used = ents[:0], 0
		}
		ents = append(ents, ent{name, idx})
		used += sz
	}
	return flush(true)
}

// dataWriter copies the data area, walking the tree by directory fd in the
// same order layout used.
type dataWriter struct {
	ctx       context.Context
	im        *image
	e         *emitter
	stack     []string
	dirBuf    []byte
	dataBytes int64
}

func (d *dataWriter) rel(name string) string {
	p := strings.Join(append(d.stack[:len(d.stack):len(d.stack)], name), "/")
	if p == "" {
		return "."
	}
	return strings.Trim(p, "/")
}

func (d *dataWriter) dir(fd int, di int32) error {
	for _, k := range d.im.nodes[di].kids {
		if err := d.ctx.Err(); err != nil {
			return err
		}
		c := &d.im.nodes[k.idx]
		if !c.emitted {
			c.emitted = true
			if err := d.node(fd, k.name, k.idx); err != nil {
				return err
			}
		}
		if !c.isDir() {
			continue
		}
		cfd, err := unix.Openat(fd, k.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("erofs: %s: open directory: %w (was the layer changed while it was written?)", d.rel(k.name), err)
		}
		d.stack = append(d.stack, k.name)
		err = d.dir(cfd, k.idx)
		d.stack = d.stack[:len(d.stack)-1]
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// node writes the data blocks of inode i, named name in dirfd.
func (d *dataWriter) node(dirfd int, name string, i int32) error {
	n := &d.im.nodes[i]
	blocks := n.dataBlocks()
	if blocks == 0 {
		return nil
	}
	e := d.e
	if e.off != int64(n.blkaddr)*BlockSize {
		return fmt.Errorf("erofs: internal error: %s: data at byte %d, layout says block %d", d.rel(name), e.off, n.blkaddr)
	}
	end := e.off + blocks*BlockSize
	switch {
	case n.isDir():
		if d.dirBuf == nil {
			d.dirBuf = make([]byte, BlockSize)
		}
		err := d.im.dirBlocks(i, d.dirBuf, func(b []byte) error {
			if e.off >= end {
				return nil // the inline tail, written with the inode
			}
			return e.write(b)
		})
		if err != nil {
			return err
		}
	case n.isLink():
		if err := e.writeString(n.target[:min(int64(len(n.target)), blocks*BlockSize)]); err != nil {
			return err
		}
	case n.isReg():
		if err := d.file(dirfd, name, n); err != nil {
			return err
		}
	}
	return e.padTo(end)
}

func (d *dataWriter) file(dirfd int, name string, n *node) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("erofs: %s: open: %w (was the layer changed while it was written?)", d.rel(name), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("erofs: %s: stat: %w", d.rel(name), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != n.size {
		return fmt.Errorf("erofs: %s: changed while the image was written (size %d, was %d); write the layer again once nothing writes to it", d.rel(name), st.Size, n.size)
	}
	_ = unix.Fadvise(fd, 0, 0, unix.FADV_SEQUENTIAL)
	read := func(off, len int64) error {
		if err := d.e.readFile(fd, off, len); err != nil {
			if err == io.ErrUnexpectedEOF {
				return fmt.Errorf("erofs: %s: shrank while the image was written; write the layer again once nothing writes to it", d.rel(name))
			}
			return fmt.Errorf("erofs: %s: read: %w", d.rel(name), err)
		}
		d.dataBytes += len
		return nil
	}
	if n.layout != layoutChunkBased {
		return read(0, n.size)
	}
	cs := int64(BlockSize) << n.chunkBits
	for c := range storedChunks(n.extents, n.chunkBits) {
		if err := read(c*cs, min(cs, n.size-c*cs)); err != nil {
			return err
		}
		if err := d.e.padTo(roundBlock(d.e.off)); err != nil {
			return err
		}
	}
	return nil
}
