package lazyfs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// mountFlags are those of every layer image's mount (layerfs/images): a
// layer holds whatever a build wrote, and its mount never runs set-id
// programs or opens devices.
const mountFlags = unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID

// MountImage mounts the image served at file (a lazyfs's, this process's
// or a sidecar's) at target, file-backed: the kernel's EROFS reads the
// file's page cache, which the lazyfs fills a request at a time.
func MountImage(file, target string) error {
	if err := unix.Mount(file, target, "erofs", mountFlags, ""); err != nil {
		return fmt.Errorf("mount -t erofs -o ro,nodev,nosuid %s %s (the kernel needs EROFS with file-backed mounts, Linux 6.12+): %w", file, target, err)
	}
	return nil
}
