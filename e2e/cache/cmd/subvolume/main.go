// Command subvolume creates a btrfs subvolume, as `btrfs subvolume
// create` does, with the caller's own rights: btrfs lets anyone who may
// write a directory create one in it. e2e's nested-subvolume scenario
// runs it in a build pod whose image has no btrfs-progs.
//
//	subvolume PATH
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// btrfsIocSubvolCreate is _IOW(0x94, 14, struct btrfs_ioctl_vol_args):
// {__s64 fd; char name[4088]}.
const btrfsIocSubvolCreate = 0x5000940e

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: subvolume PATH")
		os.Exit(2)
	}
	if err := create(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "subvolume %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func create(path string) error {
	parent, name := filepath.Split(filepath.Clean(path))
	if parent == "" {
		parent = "."
	}
	var args [4096]byte
	if len(name) == 0 || len(name) >= len(args)-8 {
		return fmt.Errorf("the name %q must have 1 to %d bytes", name, len(args)-9)
	}
	copy(args[8:], name)
	fd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), btrfsIocSubvolCreate, uintptr(unsafe.Pointer(&args[0]))); errno != 0 {
		return errno
	}
	return nil
}
