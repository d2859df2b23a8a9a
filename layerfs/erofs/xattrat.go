package erofs

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// noListxattrat is set once the kernel says listxattrat(2) (Linux 6.13)
// does not exist; then entries are reached through /proc/self/fd instead,
// which costs a procfs path lookup per entry.
var noListxattrat atomic.Bool

// listxattrat lists the xattrs of name in dirfd without following it.
// It returns unix.ENOSYS when the caller must fall back.
func listxattrat(dirfd int, name string, dest []byte) (int, error) {
	if noListxattrat.Load() {
		return 0, unix.ENOSYS
	}
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	var d unsafe.Pointer
	if len(dest) > 0 {
		d = unsafe.Pointer(&dest[0])
	}
	n, _, errno := unix.Syscall6(unix.SYS_LISTXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
		unix.AT_SYMLINK_NOFOLLOW, uintptr(d), uintptr(len(dest)), 0)
	if errno == unix.ENOSYS {
		noListxattrat.Store(true)
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}
