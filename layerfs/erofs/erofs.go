// Package erofs writes a layer directory (overlayfs format) as an
// uncompressed EROFS image that a receiving node mounts read-only,
// file-backed, as an overlay lower layer. A pull is then fetch + verify +
// mount: nothing is unpacked or translated, so holes, sockets, devices and
// ".wh."-named plain files arrive exactly as they were.
//
// The writer is pure Go and deterministic: the same tree (or a copy of it
// with other inode numbers and access times) always gives the same bytes,
// because the image carries no UUID, no build time, and lays out entries
// in byte order of their names.
//
// On-disk choices, all within what Linux's fs/erofs reads:
//   - 4 KiB blocks; superblock at byte 1024; the metadata area starts right
//     after it in block 0 (meta_blkaddr 0), data blocks follow it.
//   - Every inode is extended (64 bytes): mtime keeps nanoseconds and
//     uid/gid are 32-bit.
//   - Xattrs are inline in the inode, never shared.
//   - Directories and symlinks keep their tail inline (FLAT_INLINE) when
//     inode, xattrs and tail fit in one block; regular files without holes
//     are FLAT_PLAIN, so the data area is one sequential stream of file
//     contents and each file is opened once.
//   - Files with holes are CHUNK_BASED with a 4-byte block map; each file
//     gets the chunk size that minimises map bytes (weighted: every node
//     stores them) plus stored bytes (zeros among them are holes on a
//     receiving node).
package erofs

import (
	"encoding/binary"
	"fmt"
)

// BlockSize is the only block size this package writes or accepts: the
// receiver's page size on every platform we run on, so file-backed mounts
// need no bounce buffers.
const BlockSize = 4096

const (
	blkBits     = 12
	superOffset = 1024
	superSize   = 128
	superMagic  = 0xE0F5E1E2

	featureIncompatChunkedFile = 0x00000004

	inodeSize  = 64 // erofs_inode_extended
	slotSize   = 32 // nid unit
	direntSize = 12
	xattrHdr   = 12 // erofs_xattr_ibody_header without shared ids
	maxNameLen = 255

	layoutFlatPlain  = 0
	layoutFlatInline = 2
	layoutChunkBased = 4

	nullAddr = 0xFFFFFFFF

	// metaStart is where the first inode goes: right after the superblock,
	// 32-byte aligned, so the root's nid (a 16-bit field) is small.
	metaStart = superOffset + superSize
	// maxChunkBits caps the chunk size at 4 KiB << 24 = 64 GiB.
	maxChunkBits = 24
)

// Stats describes one written image.
type Stats struct {
	ImageBytes int64
	Inodes     int64
	// DataBytes counts bytes of file data stored, excluding holes that
	// became unmapped chunks; padding to blocks is not counted.
	DataBytes int64
}

// Superblock is what a receiver needs before it has the whole image: how
// many bytes to expect, and how many inodes it will hold.
type Superblock struct {
	Blocks uint32
	Inodes uint64
}

// ImageBytes is the exact length of the image: Write pads the image to
// whole blocks and stores nothing after the last one.
func (s Superblock) ImageBytes() int64 { return int64(s.Blocks) * BlockSize }

// ParseSuperblock checks that first4K starts an image this package writes,
// so a receiver can refuse a foreign or tampered image before it stores or
// mounts it: another block size, a checksum, compression, extra devices or
// any feature bit we never set are all refused.
func ParseSuperblock(first4K []byte) (Superblock, error) {
	if len(first4K) < superOffset+superSize {
		return Superblock{}, fmt.Errorf("erofs: superblock: got %d bytes, need at least %d (pass the first %d bytes of the image)", len(first4K), superOffset+superSize, BlockSize)
	}
	sb := first4K[superOffset : superOffset+superSize]
	le := binary.LittleEndian
	if m := le.Uint32(sb[0:]); m != superMagic {
		return Superblock{}, fmt.Errorf("erofs: superblock: magic %#x is not EROFS (%#x): not an image, or not from its start", m, superMagic)
	}
	if bits := sb[12]; bits != blkBits {
		return Superblock{}, fmt.Errorf("erofs: superblock: block size 2^%d, this package only reads images with %d-byte blocks", bits, BlockSize)
	}
	if c := le.Uint32(sb[4:]); c != 0 {
		return Superblock{}, fmt.Errorf("erofs: superblock: checksum %#x set; images from this package carry none (verify the image digest instead)", c)
	}
	if f := le.Uint32(sb[8:]); f != 0 {
		return Superblock{}, fmt.Errorf("erofs: superblock: compat features %#x; images from this package set none", f)
	}
	if f := le.Uint32(sb[80:]); f&^featureIncompatChunkedFile != 0 {
		return Superblock{}, fmt.Errorf("erofs: superblock: incompat features %#x; images from this package set at most %#x (chunked files)", f, featureIncompatChunkedFile)
	}
	switch {
	case sb[13] != 0:
		return Superblock{}, fmt.Errorf("erofs: superblock: %d extension slots; images from this package have none", sb[13])
	case le.Uint16(sb[84:]) != 0:
		return Superblock{}, fmt.Errorf("erofs: superblock: compression settings present; images from this package are uncompressed")
	case le.Uint16(sb[86:]) != 0:
		return Superblock{}, fmt.Errorf("erofs: superblock: %d extra devices; images from this package are self-contained", le.Uint16(sb[86:]))
	case sb[90] != 0:
		return Superblock{}, fmt.Errorf("erofs: superblock: directory block bits %d; images from this package use 0", sb[90])
	case sb[91] != 0 || le.Uint64(sb[96:]) != 0:
		return Superblock{}, fmt.Errorf("erofs: superblock: long xattr prefixes or a packed inode; images from this package use neither")
	}
	s := Superblock{Blocks: le.Uint32(sb[36:]), Inodes: le.Uint64(sb[16:])}
	if s.Blocks == 0 || s.Inodes == 0 {
		return Superblock{}, fmt.Errorf("erofs: superblock: %d blocks, %d inodes: truncated or damaged image", s.Blocks, s.Inodes)
	}
	return s, nil
}

// putSuperblock encodes the superblock into b (len superSize).
func putSuperblock(b []byte, rootNid uint16, inodes uint64, blocks uint32, incompat uint32) {
	clear(b)
	le := binary.LittleEndian
	le.PutUint32(b[0:], superMagic)
	b[12] = blkBits
	le.PutUint16(b[14:], rootNid)
	le.PutUint64(b[16:], inodes)
	le.PutUint32(b[36:], blocks)
	le.PutUint32(b[80:], incompat)
}

// newEncodeDev is the kernel's new_encode_dev: what erofs stores in i_u.
func newEncodeDev(major, minor uint32) uint32 {
	return minor&0xff | major<<8 | (minor&^0xff)<<12
}

// fileType is the dirent file_type (the kernel's FT_* values).
func fileType(mode uint32) uint8 {
	switch mode & 0o170000 {
	case 0o100000:
		return 1
	case 0o040000:
		return 2
	case 0o020000:
		return 3
	case 0o060000:
		return 4
	case 0o010000:
		return 5
	case 0o140000:
		return 6
	case 0o120000:
		return 7
	}
	return 0
}
