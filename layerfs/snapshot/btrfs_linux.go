package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// btrfs subvolumes and qgroups through the kernel's ioctls (uapi
// linux/btrfs.h): the node agent's image carries no btrfs CLI. The
// structs mirror the kernel's byte for byte; btrfs_test.go checks their
// sizes, which the ioctl numbers encode.

const (
	btrfsIocSubvolCreate    = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocSnapDestroy     = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocTreeSearch      = 0xd0009411 // _IOWR(0x94, 17, struct btrfs_ioctl_search_args)
	btrfsIocInoLookup       = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	btrfsIocSnapCreateV2    = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	btrfsIocQuotaCtl        = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	btrfsIocQgroupAssign    = 0x40189429 // _IOW(0x94, 41, struct btrfs_ioctl_qgroup_assign_args)
	btrfsIocQgroupCreate    = 0x4010942a // _IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)
	btrfsIocQgroupLimit     = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	btrfsIocQuotaRescanWait = 0x942e     // _IO(0x94, 46)
	btrfsIocGetSubvolInfo   = 0x81f8943c // _IOR(0x94, 60, struct btrfs_ioctl_get_subvol_info_args)

	btrfsSubvolRdonly       = 1 << 1 // BTRFS_SUBVOL_RDONLY
	btrfsQuotaCtlEnable     = 1      // BTRFS_QUOTA_CTL_ENABLE
	btrfsQuotaCtlSimple     = 4      // BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA (Linux 6.7+)
	btrfsQgroupLimitMaxExcl = 1 << 1 // BTRFS_QGROUP_LIMIT_MAX_EXCL

	btrfsFirstFreeObjectID = 256    // BTRFS_FIRST_FREE_OBJECTID: a subvolume's root inode
	btrfsRootTreeID        = 1      // BTRFS_ROOT_TREE_OBJECTID
	btrfsQuotaTreeID       = 8      // BTRFS_QUOTA_TREE_OBJECTID
	btrfsRootItemKey       = 132    // BTRFS_ROOT_ITEM_KEY
	btrfsInodeItemKey      = 1      // BTRFS_INODE_ITEM_KEY
	btrfsQgroupInfoKey     = 242    // BTRFS_QGROUP_INFO_KEY
	btrfsQgroupStatusKey   = 240    // BTRFS_QGROUP_STATUS_KEY
	btrfsQgroupSimpleMode  = 1 << 3 // BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE
)

// btrfsVolArgs is struct btrfs_ioctl_vol_args (4096 bytes).
type btrfsVolArgs struct {
	Fd   int64
	Name [4088]byte
}

// btrfsVolArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes).
type btrfsVolArgsV2 struct {
	Fd      int64
	Transid uint64
	Flags   uint64
	Unused  [4]uint64 // size and qgroup_inherit: none
	Name    [4040]byte
}

// btrfsInoLookupArgs is struct btrfs_ioctl_ino_lookup_args (4096 bytes).
type btrfsInoLookupArgs struct {
	Treeid   uint64
	Objectid uint64
	Name     [4080]byte
}

// btrfsQuotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
type btrfsQuotaCtlArgs struct {
	Cmd    uint64
	Status uint64
}

// btrfsQgroupCreateArgs is struct btrfs_ioctl_qgroup_create_args.
type btrfsQgroupCreateArgs struct {
	Create   uint64
	Qgroupid uint64
}

// btrfsQgroupAssignArgs is struct btrfs_ioctl_qgroup_assign_args.
type btrfsQgroupAssignArgs struct {
	Assign, Src, Dst uint64
}

// btrfsQgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args with its
// struct btrfs_qgroup_limit inlined.
type btrfsQgroupLimitArgs struct {
	Qgroupid uint64
	Flags    uint64
	MaxRfer  uint64
	MaxExcl  uint64
	RsvRfer  uint64
	RsvExcl  uint64
}

// btrfsSearchKey is struct btrfs_ioctl_search_key (104 bytes).
type btrfsSearchKey struct {
	TreeID, MinObjectid, MaxObjectid, MinOffset, MaxOffset, MinTransid, MaxTransid uint64
	MinType, MaxType, NrItems, _                                                   uint32
	_                                                                              [4]uint64
}

// btrfsSearchArgs is struct btrfs_ioctl_search_args (4096 bytes).
type btrfsSearchArgs struct {
	Key btrfsSearchKey
	Buf [4096 - 104]byte
}

// btrfsSubvolInfo is the part of struct btrfs_ioctl_get_subvol_info_args
// (504 bytes) that layerfs reads; the rest is padding here.
type btrfsSubvolInfo struct {
	Treeid     uint64
	_          [256]byte // name
	ParentID   uint64
	Dirid      uint64
	Generation uint64
	Flags      uint64
	_          [48]byte // uuid, parent_uuid, received_uuid
	Ctransid   uint64
	Otransid   uint64
	_          [504 - 360]byte
}

func btrfsIoctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// withDir runs fn on an open fd of dir.
func withDir(dir string, fn func(fd int) error) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(fd)
}

// setName copies a subvolume name into an ioctl's name field.
func setName(dst []byte, name string) error {
	if len(name) >= len(dst) || name == "" || filepath.Base(name) != name {
		return fmt.Errorf("invalid subvolume name %q", name)
	}
	copy(dst, name)
	return nil
}

// createSubvolume makes an empty subvolume at path.
func createSubvolume(path string) error {
	var args btrfsVolArgs
	if err := setName(args.Name[:], filepath.Base(path)); err != nil {
		return err
	}
	ondisk.FaultPoint()
	err := withDir(filepath.Dir(path), func(fd int) error {
		return btrfsIoctl(fd, btrfsIocSubvolCreate, unsafe.Pointer(&args))
	})
	if err != nil {
		return fmt.Errorf("create btrfs subvolume %s: %w", path, err)
	}
	return nil
}

// snapshotSubvolume makes dst a snapshot of the subvolume src, read-only
// or writable. The kernel commits a transaction for it: once it returns,
// the snapshot is on disk.
func snapshotSubvolume(src, dst string, readOnly bool) error {
	var args btrfsVolArgsV2
	if err := setName(args.Name[:], filepath.Base(dst)); err != nil {
		return err
	}
	if readOnly {
		args.Flags = btrfsSubvolRdonly
	}
	ondisk.FaultPoint()
	err := withDir(src, func(srcFd int) error {
		args.Fd = int64(srcFd)
		return withDir(filepath.Dir(dst), func(fd int) error {
			return btrfsIoctl(fd, btrfsIocSnapCreateV2, unsafe.Pointer(&args))
		})
	})
	if err != nil {
		return fmt.Errorf("snapshot btrfs subvolume %s to %s: %w", src, dst, err)
	}
	return nil
}

// deleteSubvolume deletes the subvolume at path (read-only ones too: root
// may) and then its qgroup; a missing path is no error. The kernel frees
// its extents in the background; the qgroup can only go after that, so a
// qgroup still busy is left for sweepQgroups.
func deleteSubvolume(path string) error {
	id, err := subvolumeID(path)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	var args btrfsVolArgs
	if err := setName(args.Name[:], filepath.Base(path)); err != nil {
		return err
	}
	ondisk.FaultPoint()
	destroy := func() error {
		return withDir(filepath.Dir(path), func(fd int) error {
			return btrfsIoctl(fd, btrfsIocSnapDestroy, unsafe.Pointer(&args))
		})
	}
	err = destroy()
	if errors.Is(err, unix.ENOTEMPTY) {
		// A build nested subvolumes in it (any user may): they go first.
		// Unlinking them writes to this subvolume's tree, which a volume
		// at its limit would refuse (EDQUOT): the limit goes first.
		limitExclusive(filepath.Dir(path), volumeQgroup(id), noLimit) // none for a generation
		if err = deleteNested(path); err == nil {
			err = destroy()
		}
	}
	if err != nil {
		return fmt.Errorf("delete btrfs subvolume %s: %w", path, err)
	}
	destroyEmptyQgroup(filepath.Dir(path), id) // best effort; see sweepQgroups
	return nil
}

// deleteNested deletes the subvolumes nested anywhere under the subvolume
// at path, the deepest first (btrfs deletes only a subvolume without
// nested ones). The walk is paid only when a deletion found some.
func deleteNested(path string) error {
	var nested []string
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != path && d.IsDir() && isSubvolume(p) {
			nested = append(nested, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("find the subvolumes nested in %s: %w", path, err)
	}
	// WalkDir visits a directory before its contents: backwards is
	// deepest first.
	for i := len(nested) - 1; i >= 0; i-- {
		if err := deleteSubvolume(nested[i]); err != nil {
			return err
		}
	}
	return nil
}

// destroyEmptyQgroup removes qgroup 0/id if it counts no bytes. With
// simple quotas a deleted volume's qgroup keeps counting the data a
// generation still holds (a cache's size is the sum of those), and a
// kernel that would let it go then must not be asked to.
func destroyEmptyQgroup(dir string, id uint64) {
	all, err := qgroups(dir)
	if err != nil {
		return
	}
	for _, q := range all {
		if q.ID == id && q.Referenced == 0 && q.Excl == 0 {
			destroyQgroup(dir, id)
		}
	}
}

// subvolumeID is the tree id of the subvolume whose root is path.
func subvolumeID(path string) (uint64, error) {
	args := btrfsInoLookupArgs{Objectid: btrfsFirstFreeObjectID}
	err := withDir(path, func(fd int) error {
		return btrfsIoctl(fd, btrfsIocInoLookup, unsafe.Pointer(&args))
	})
	if err != nil {
		return 0, fmt.Errorf("look up the btrfs subvolume id of %s: %w", path, err)
	}
	return args.Treeid, nil
}

// subvolumeInfo reads the subvolume's transaction ids.
func subvolumeInfo(path string) (btrfsSubvolInfo, error) {
	var info btrfsSubvolInfo
	err := withDir(path, func(fd int) error {
		return btrfsIoctl(fd, btrfsIocGetSubvolInfo, unsafe.Pointer(&info))
	})
	if err != nil {
		return info, fmt.Errorf("read btrfs subvolume info of %s: %w", path, err)
	}
	return info, nil
}

// enableQuotas turns qgroups on for the filesystem at dir: simple quotas
// where the kernel has them (Linux 6.7+), full qgroups elsewhere, and
// waits for a full mode's initial rescan so that later sizes are exact.
// Quotas already on stay in their mode. Simple quotas charge each extent
// to the subvolume that wrote it, which is what a volume's limit bounds
// (what its build adds), and cost nothing per shared tree block; full
// qgroups walk the back references of every block a write to a snapshot
// unshares, which made a build on a 50,000-file cache 6x slower than on
// an empty one (BenchmarkSnapshotBuildLargeVsEmpty).
func enableQuotas(dir string) error {
	return withDir(dir, func(fd int) error {
		args := btrfsQuotaCtlArgs{Cmd: btrfsQuotaCtlSimple}
		err := btrfsIoctl(fd, btrfsIocQuotaCtl, unsafe.Pointer(&args))
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			args = btrfsQuotaCtlArgs{Cmd: btrfsQuotaCtlEnable}
			err = btrfsIoctl(fd, btrfsIocQuotaCtl, unsafe.Pointer(&args))
		}
		if err != nil {
			return fmt.Errorf("enable btrfs quotas on %s: %w", dir, err)
		}
		if err := btrfsIoctl(fd, btrfsIocQuotaRescanWait, nil); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("wait for the btrfs quota rescan of %s: %w", dir, err)
		}
		return nil
	})
}

// simpleQuotas tells whether the filesystem at dir keeps simple quotas
// (its quota status item's flags).
func simpleQuotas(dir string) (bool, error) {
	simple := false
	err := searchTree(dir, btrfsSearchKey{
		TreeID: btrfsQuotaTreeID, MinType: btrfsQgroupStatusKey, MaxType: btrfsQgroupStatusKey,
		MaxTransid: ^uint64(0),
	}, func(h searchHeader, item []byte) {
		if h.Type == btrfsQgroupStatusKey && len(item) >= 24 {
			simple = binary.LittleEndian.Uint64(item[16:])&btrfsQgroupSimpleMode != 0
		}
	})
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return simple, err
}

// noLimit lifts a qgroup's limit (the kernel's CLEAR_VALUE).
const noLimit = -1

// limitExclusive bounds what qgroup id may hold on its own: writes past
// it fail with EDQUOT (noLimit lifts the bound). dir is any path on the
// filesystem.
func limitExclusive(dir string, id uint64, bytes int64) error {
	args := btrfsQgroupLimitArgs{Qgroupid: id, Flags: btrfsQgroupLimitMaxExcl, MaxExcl: uint64(bytes)}
	err := withDir(dir, func(fd int) error {
		return btrfsIoctl(fd, btrfsIocQgroupLimit, unsafe.Pointer(&args))
	})
	if err != nil {
		return fmt.Errorf("limit btrfs qgroup %s to %d exclusive bytes: %w", qgroupName(id), bytes, err)
	}
	return nil
}

// volumeQgroup is the level-1 qgroup that bounds a snapshot volume: the
// parent of its subvolume's qgroup and, with simple quotas, of those of
// the subvolumes a build nests in it (the kernel puts a new subvolume's
// qgroup under the single parent of the qgroup of the subvolume it is
// created in), so that nesting cannot write past the volume's limit.
func volumeQgroup(subvol uint64) uint64 { return 1<<48 | subvol }

// qgroupName is qgroup id as btrfs(8) writes it, level/id.
func qgroupName(id uint64) string { return fmt.Sprintf("%d/%d", id>>48, id&(1<<48-1)) }

// createQgroup makes qgroup id; one that exists already is reused.
func createQgroup(dir string, id uint64) error {
	args := btrfsQgroupCreateArgs{Create: 1, Qgroupid: id}
	err := withDir(dir, func(fd int) error {
		return btrfsIoctl(fd, btrfsIocQgroupCreate, unsafe.Pointer(&args))
	})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create btrfs qgroup %s: %w", qgroupName(id), err)
	}
	return nil
}

// assignQgroup makes qgroup parent a parent of qgroup child.
func assignQgroup(dir string, child, parent uint64) error {
	args := btrfsQgroupAssignArgs{Assign: 1, Src: child, Dst: parent}
	err := withDir(dir, func(fd int) error {
		return btrfsIoctl(fd, btrfsIocQgroupAssign, unsafe.Pointer(&args))
	})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("make btrfs qgroup %s a parent of %s: %w", qgroupName(parent), qgroupName(child), err)
	}
	return nil
}

// destroyQgroup removes qgroup id (0/id of a deleted subvolume, or a
// volumeQgroup). The kernel refuses (EBUSY) while the subvolume's extents
// are still being freed, or while the qgroup has members; ENOENT means it
// is gone already (newer kernels remove a subvolume's themselves).
func destroyQgroup(dir string, id uint64) error {
	args := btrfsQgroupCreateArgs{Create: 0, Qgroupid: id}
	return withDir(dir, func(fd int) error {
		err := btrfsIoctl(fd, btrfsIocQgroupCreate, unsafe.Pointer(&args))
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	})
}

// qgroupUsage is a qgroup's numbers as the last transaction left them.
type qgroupUsage struct {
	ID               uint64
	Referenced, Excl int64
}

// qgroups reads every level-0 qgroup's usage from the quota tree.
func qgroups(dir string) ([]qgroupUsage, error) {
	return qgroupsBetween(dir, 0, 1<<48-1)
}

// volumeQgroups reads the usage of every level-1 qgroup (volumeQgroup).
func volumeQgroups(dir string) ([]qgroupUsage, error) {
	return qgroupsBetween(dir, 1<<48, 2<<48-1)
}

// qgroupsBetween reads the usage of the qgroups with ids in [first, last].
func qgroupsBetween(dir string, first, last uint64) ([]qgroupUsage, error) {
	var out []qgroupUsage
	err := searchTree(dir, btrfsSearchKey{
		TreeID: btrfsQuotaTreeID, MaxObjectid: 0, MinOffset: first, MaxOffset: last, MaxTransid: ^uint64(0),
		MinType: btrfsQgroupInfoKey, MaxType: btrfsQgroupInfoKey,
	}, func(h searchHeader, item []byte) {
		if h.Type != btrfsQgroupInfoKey || len(item) < 40 {
			return
		}
		out = append(out, qgroupUsage{
			ID:         h.Offset,
			Referenced: int64(binary.LittleEndian.Uint64(item[8:])),
			Excl:       int64(binary.LittleEndian.Uint64(item[24:])),
		})
	})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil // quotas are off: no quota tree
	}
	return out, err
}

// changedInodes lists the inodes of subvolume tree whose items changed in
// a transaction after sinceTransid (as `btrfs subvolume find-new` does).
// The kernel walks only the tree nodes written since, so the cost is that
// of the changes, not of the subvolume.
func changedInodes(dir string, tree, sinceTransid uint64) ([]uint64, error) {
	var out []uint64
	err := searchTree(dir, btrfsSearchKey{
		TreeID: tree, MaxObjectid: ^uint64(0), MaxOffset: ^uint64(0),
		MinTransid: sinceTransid + 1, MaxTransid: ^uint64(0),
		MinType: btrfsInodeItemKey, MaxType: btrfsInodeItemKey,
	}, func(h searchHeader, item []byte) {
		// The leaf is newer; the inode only if its own transid is.
		if h.Type == btrfsInodeItemKey && len(item) >= 16 && binary.LittleEndian.Uint64(item[8:]) > sinceTransid {
			out = append(out, h.Objectid)
		}
	})
	return out, err
}

// searchHeader is struct btrfs_ioctl_search_header.
type searchHeader struct {
	Transid, Objectid, Offset uint64
	Type, Len                 uint32
}

// searchTree runs BTRFS_IOC_TREE_SEARCH over key's range, batch after
// batch, calling fn for each item.
func searchTree(dir string, key btrfsSearchKey, fn func(searchHeader, []byte)) error {
	return withDir(dir, func(fd int) error {
		var args btrfsSearchArgs
		args.Key = key
		for {
			args.Key.NrItems = 4096
			if err := btrfsIoctl(fd, btrfsIocTreeSearch, unsafe.Pointer(&args)); err != nil {
				return fmt.Errorf("search btrfs tree %d under %s: %w", key.TreeID, dir, err)
			}
			if args.Key.NrItems == 0 {
				return nil
			}
			var last searchHeader
			off := 0
			for range args.Key.NrItems {
				h := searchHeader{
					Transid:  binary.LittleEndian.Uint64(args.Buf[off:]),
					Objectid: binary.LittleEndian.Uint64(args.Buf[off+8:]),
					Offset:   binary.LittleEndian.Uint64(args.Buf[off+16:]),
					Type:     binary.LittleEndian.Uint32(args.Buf[off+24:]),
					Len:      binary.LittleEndian.Uint32(args.Buf[off+28:]),
				}
				off += 32
				fn(h, args.Buf[off:off+int(h.Len)])
				off += int(h.Len)
				last = h
			}
			if !nextSearchKey(&args.Key, last) {
				return nil
			}
		}
	})
}

// nextSearchKey moves the search's start past the last item returned, in
// the (objectid, type, offset) order of btrfs keys.
func nextSearchKey(k *btrfsSearchKey, last searchHeader) bool {
	k.MinObjectid, k.MinType, k.MinOffset = last.Objectid, last.Type, last.Offset
	switch {
	case k.MinOffset < ^uint64(0):
		k.MinOffset++
	case k.MinType < 255:
		k.MinOffset, k.MinType = 0, k.MinType+1
	case k.MinObjectid < ^uint64(0):
		k.MinOffset, k.MinType, k.MinObjectid = 0, 0, k.MinObjectid+1
	default:
		return false
	}
	return k.MinObjectid <= k.MaxObjectid
}

// isBtrfs tells whether path is on btrfs (statfs magic).
func isBtrfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.BTRFS_SUPER_MAGIC
}

// isSubvolume tells whether path is a subvolume's root (inode 256 on btrfs).
func isSubvolume(path string) bool {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false
	}
	return st.Ino == btrfsFirstFreeObjectID && isBtrfs(path)
}
