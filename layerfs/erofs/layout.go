package erofs

import (
	"fmt"
	"iter"
	"math"
)

// image is a scanned tree with every inode's place decided.
type image struct {
	nodes     []node
	order     []int32 // inodes in nid order: preorder, a hardlink at its first name
	dataStart int64   // first byte of the data area (block aligned)
	blocks    uint32  // blocks in the whole image
	incompat  uint32
}

// dirents yields a directory's entries in byte order, "." and ".." included,
// which is the order the kernel's binary search in namei.c expects.
func (im *image) dirents(d int32) iter.Seq2[string, int32] {
	return func(yield func(string, int32) bool) {
		n := &im.nodes[d]
		dots := [2]child{{".", d}, {"..", n.parent}}
		i := 0
		for _, k := range n.kids {
			for i < 2 && dots[i].name < k.name {
				if !yield(dots[i].name, dots[i].idx) {
					return
				}
				i++
			}
			if !yield(k.name, k.idx) {
				return
			}
		}
		for ; i < 2; i++ {
			if !yield(dots[i].name, dots[i].idx) {
				return
			}
		}
	}
}

// dirSize is the size of a directory's dirent blocks: whole blocks for all
// but the last, and the used bytes of the last. An entry never spans blocks.
func (im *image) dirSize(d int32) int64 {
	var full, used int64
	for name := range im.dirents(d) {
		sz := int64(direntSize + len(name))
		if used+sz > BlockSize {
			full++
			used = 0
		}
		used += sz
	}
	return full*BlockSize + used
}

// storedChunks yields the chunks of a file with holes that hold data, in order.
func storedChunks(ext []extent, bits uint8) iter.Seq[int64] {
	return func(yield func(int64) bool) {
		shift := blkBits + uint(bits)
		last := int64(-1)
		for _, e := range ext {
			for c := max(e.off>>shift, last+1); c <= (e.end-1)>>shift; c++ {
				if !yield(c) {
					return
				}
				last = c
			}
		}
	}
}

// chunkBytes is how many bytes chunk c of a file of this size stores: the
// last chunk stops at the file's last block.
func chunkBytes(size int64, bits uint8, c int64) int64 {
	cs := int64(BlockSize) << bits
	return min(cs, roundBlock(size)-c*cs)
}

// mapWeight is what a byte of block map costs against a stored byte. The
// map of holes is 0xff bytes that every receiving node stores; the zeros
// of a stored chunk around its data compress to nearly nothing on the way
// and are written as holes on arrival (layerfs's sparse receive), so they
// cost only the time to stream them.
const mapWeight = 16

// chooseChunkBits picks the chunk size that makes the weighted block map
// plus the stored chunks smallest: 4 KiB chunks for a file with a few
// holes, large ones for a huge file with little data (1 TiB with one 4 KiB
// extent: 8 MiB chunks, a 512 KiB map and one 8 MiB chunk of which 4 KiB
// takes space on a receiving node).
func chooseChunkBits(size int64, ext []extent) uint8 {
	best, bestCost := uint8(0), int64(math.MaxInt64)
	for bits := uint8(0); bits <= maxChunkBits; bits++ {
		cs := int64(BlockSize) << bits
		cost := mapWeight * 4 * ((size + cs - 1) / cs)
		for c := range storedChunks(ext, bits) {
			cost += chunkBytes(size, bits, c)
			if cost >= bestCost {
				break
			}
		}
		if cost < bestCost {
			best, bestCost = bits, cost
		}
	}
	return best
}

func numChunks(size int64, bits uint8) int64 {
	cs := int64(BlockSize) << bits
	return (size + cs - 1) / cs
}

// dataBlocks is how many blocks of the data area an inode uses.
func (n *node) dataBlocks() int64 {
	switch {
	case n.layout == layoutChunkBased:
		var b int64
		for c := range storedChunks(n.extents, n.chunkBits) {
			b += chunkBytes(n.size, n.chunkBits, c) / BlockSize
		}
		return b
	case n.layout == layoutFlatInline:
		return n.size / BlockSize
	case n.isReg() || n.isDir() || n.isLink():
		return roundBlock(n.size) / BlockSize
	}
	return 0
}

// layout decides every inode's nid, data layout and data blocks.
//
// Metadata: each inode's record (64-byte inode, inline xattrs, then an
// inline tail or a block map) starts 32-byte aligned after the previous one;
// a record that fits in a block never crosses a block boundary, which is the
// kernel's rule for inline tails and keeps an inode in one metadata read.
// Data: whole blocks, the directories' and symlinks' first, right after
// the inodes, then the regular files', each part in the inodes' order. All
// of the tree's metadata is then one run at the image's start: a node that
// mounts the image before its bytes are here checks that metadata first
// (erofs.Check), and each block of it elsewhere was one more fetch (a
// directory's entries between its files' data put a 50-directory cache's
// metadata in some 50 chunks of 1 MiB, against 5 in one run), and a
// build's reads of a directory's files stay in one run of data.
func layout(nodes []node) (*image, error) {
	im := &image{nodes: nodes, order: make([]int32, 0, len(nodes))}
	seen := make([]bool, len(nodes))
	seen[0] = true
	im.order = append(im.order, 0)
	var visit func(d int32)
	visit = func(d int32) {
		for _, k := range im.nodes[d].kids {
			if !seen[k.idx] {
				seen[k.idx] = true
				im.order = append(im.order, k.idx)
			}
			if im.nodes[k.idx].isDir() {
				visit(k.idx)
			}
		}
	}
	visit(0)

	cursor := int64(metaStart)
	for _, i := range im.order {
		n := &nodes[i]
		if n.isDir() {
			n.size = im.dirSize(i)
		}
		rec := int64(inodeSize + len(n.xattrs))
		switch {
		case n.extents != nil:
			n.layout = layoutChunkBased
			n.chunkBits = chooseChunkBits(n.size, n.extents)
			rec += 4 * numChunks(n.size, n.chunkBits)
			im.incompat |= featureIncompatChunkedFile
		case n.isDir() || n.isLink():
			// Regular files stay FLAT_PLAIN: their tails would have to be read
			// while writing metadata, opening every file twice.
			if tail := n.size % BlockSize; tail > 0 && rec+tail <= BlockSize {
				n.layout = layoutFlatInline
				rec += tail
			}
		}
		cursor = (cursor + slotSize - 1) &^ (slotSize - 1)
		if rec <= BlockSize && cursor%BlockSize+rec > BlockSize {
			cursor = roundBlock(cursor)
		}
		n.nid = uint64(cursor / slotSize)
		cursor += rec
	}
	if nodes[0].nid > math.MaxUint16 {
		return nil, fmt.Errorf("erofs: internal error: root nid %d does not fit the superblock", nodes[0].nid)
	}

	im.dataStart = roundBlock(cursor)
	blk := im.dataStart / BlockSize
	for _, regular := range []bool{false, true} {
		for _, i := range im.order {
			n := &nodes[i]
			if n.isReg() != regular {
				continue
			}
			if b := n.dataBlocks(); b > 0 {
				n.blkaddr = uint32(blk)
				blk += b
			}
			if blk >= nullAddr {
				return nil, fmt.Errorf("erofs: the tree needs more than %d blocks of %d bytes, more than one EROFS image can address; split the layer", uint32(nullAddr), BlockSize)
			}
		}
	}
	im.blocks = uint32(blk)
	return im, nil
}
