// Package snapshot is the btrfs side of layerfs's snapshot layout: the
// area where a store keeps its snapshot caches and the subvolumes in it.
//
//	<root>/snapshot/                     btrfs: a directory of a btrfs root,
//	                                     or snapshot.img through a loop device
//	<root>/snapshot/generations/<id>     a cache's head generation, read-only
//	<root>/snapshot/volumes/<volume-id>  a volume's writable snapshot of it
//	<root>/snapshot.img                  the sparse btrfs image, if the root
//	                                     is not btrfs (mkfs.btrfs once)
//
// A volume is a writable snapshot of its cache's generation, bind-mounted
// where the store wants it; a commit is a read-only snapshot of the volume;
// size limits are qgroup limits, enforced as the build writes. Everything
// at run time is an ioctl (btrfs_linux.go, and package layerfs/loop).
//
// The package knows subvolumes, not caches: which generation a head names
// and which volumes exist is the store's (layerfs), which records it and
// tells the sweep what is named.
package snapshot
