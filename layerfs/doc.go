// Package layerfs is the node-local layered cache store.
//
// A cache is an ordered list of immutable overlayfs layers (its head). A
// volume is an overlay mount whose lower layers are the cache's head at mount
// time and whose upper layer is private to the volume; committing a volume
// turns its upper layer into the cache's newest layer. A volume's upper
// directory is born where its layer will live (layers/<id>), so a commit
// moves nothing: it unmounts, syncs and rewrites the head. No byte of the
// cache is copied.
//
// Layout under the root:
//
//	layers/<id>/                         layers in overlay format: immutable
//	                                     once a head names them, the upper
//	                                     directory of the volume that names it
//	images/<id>                          pulled layers' EROFS images, mounted
//	                                     at layers/<id>
//	caches/<namespace>/<name>/head.json  generation and layer list
//	volumes/<id>/{work,merged,volume.json,control}
//	locks/                               flock files
//	tmp/                                 squash views, pulls in progress, trash, probes
//	probe.json, reserve                  last overlay probe; space kept for a full disk
//	snapshot/{generations,volumes}/<id>  snapshot caches: btrfs subvolumes
//	snapshot.img                         their btrfs image, if the root is not btrfs
//
// A cache has one layout for life (Layout, MountOptions.Layout). With
// LayoutSnapshot a cache is one read-only btrfs subvolume (its head
// generation), a volume is a writable snapshot of it bind-mounted at the
// volume's merged path, and a commit is a read-only snapshot of the volume
// that replaces the head (whole-volume last writer wins); size limits are
// qgroup limits, enforced as the build writes. Subvolumes and qgroups are
// made with ioctls (package layerfs/snapshot). A snapshot cache has
// nothing to squash; it syncs through a registry one whole generation at
// a time, each published as an EROFS image of its subvolume and taken in
// as a new generation (snapshot_sync.go). Each
// layout is a volumeLayout (layouts.go); the store picks a cache's in one
// place (layoutOf) and asks it for everything the layouts do differently.
//
// The directories are root-only (0700): layer roots may be world-writable
// and their paths are public in /proc/*/mountinfo.
// Every on-disk change is atomic (build in a new-* temp path, fsync, rename),
// and every operation takes flock locks so that several processes (the node
// agent and the CLI) can use one store at once. Heads and volume records
// change only in transactions (txn.go). A layer exists iff a head or a
// volume record names it; the sweep removes the rest.
//
// Commits that run at once (builds that end together) share their costs:
// an overlay volume is sealed (unmounted, synced, measured) under its own
// lock, and its cache's lock is taken only to write the head; the syncfs
// that puts a volume's data on disk before its head names it is shared
// with the commits in flight (one that starts after a commit's writes
// covers them: ondisk.SyncGroup); and a process's waiters for a cache's lock
// queue in memory ahead of the flock, so the lock passes on at once.
//
// Across nodes, layers travel through an OCI registry (ExportLayer,
// SetLayerDigest, Sync; the registry client is the caller's), as EROFS
// images that a node keeps and mounts as they are (package
// layerfs/images). A layer is published once it has a Digest
// (LayerInfo.Digest) in the cache's own repository; a squash of
// published layers lists theirs in LayerInfo.Covers and counts as
// published too. A layer seeded from a fallback may keep the fallback's
// digest with LayerInfo.MountFrom, its repository: unpublished, until
// SetLayerDigest records it as the cache's. Sync makes a head the
// cluster-wide chain with the node's unpublished layers on top.
//
// Errors: ErrNotFound (errors.Is) for unknown volumes and caches,
// *InvalidNameError for bad names, ErrBusy when a mount is still in use.
package layerfs
