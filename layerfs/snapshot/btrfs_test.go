package snapshot

import (
	"testing"
	"unsafe"
)

// The ioctl numbers encode the sizes of their structs (uapi
// linux/btrfs.h); a struct of another size would make the kernel read or
// write past it.
func TestBtrfsStructSizes(t *testing.T) {
	for _, tt := range []struct {
		name      string
		got, want uintptr
		req       uint32
	}{
		{"btrfs_ioctl_vol_args", unsafe.Sizeof(btrfsVolArgs{}), 4096, btrfsIocSubvolCreate},
		{"btrfs_ioctl_vol_args_v2", unsafe.Sizeof(btrfsVolArgsV2{}), 4096, btrfsIocSnapCreateV2},
		{"btrfs_ioctl_ino_lookup_args", unsafe.Sizeof(btrfsInoLookupArgs{}), 4096, btrfsIocInoLookup},
		{"btrfs_ioctl_quota_ctl_args", unsafe.Sizeof(btrfsQuotaCtlArgs{}), 16, btrfsIocQuotaCtl},
		{"btrfs_ioctl_qgroup_create_args", unsafe.Sizeof(btrfsQgroupCreateArgs{}), 16, btrfsIocQgroupCreate},
		{"btrfs_ioctl_qgroup_limit_args", unsafe.Sizeof(btrfsQgroupLimitArgs{}), 48, btrfsIocQgroupLimit},
		{"btrfs_ioctl_search_args", unsafe.Sizeof(btrfsSearchArgs{}), 4096, btrfsIocTreeSearch},
		{"btrfs_ioctl_get_subvol_info_args", unsafe.Sizeof(btrfsSubvolInfo{}), 504, btrfsIocGetSubvolInfo},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %d bytes, want %d", tt.name, tt.got, tt.want)
		}
		if size := uintptr(tt.req>>16) & 0x3fff; size != tt.want {
			t.Errorf("%s: ioctl %#x encodes %d bytes, want %d", tt.name, tt.req, size, tt.want)
		}
	}
	if off := unsafe.Offsetof(btrfsSubvolInfo{}.Otransid); off != 352 {
		t.Errorf("otransid at %d, want 352", off)
	}
	if off := unsafe.Offsetof(btrfsVolArgsV2{}.Name); off != 56 {
		t.Errorf("vol_args_v2 name at %d, want 56", off)
	}
}
