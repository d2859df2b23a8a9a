package layerfs

import (
	"context"
)

// volumeLayout is how one layout keeps caches and their volumes. The
// store owns the transactions, heads, records and locks and composes the
// layouts (layoutOf); it asks a cache's layout for all that differs
// between them and tells them apart nowhere else.
type volumeLayout interface {
	// create makes volume id of t's cache as opts ask, records it in t
	// and mounts it; on failure nothing of it remains (a crash leaves
	// what Recover and the sweep remove).
	create(t *txn, id string, opts MountOptions) error
	// remount mounts t's volume again (after a reboot or a failed
	// commit), marking it torn if a crash may have cut its build short.
	remount(t *txn) error
	// sealsUnlocked tells whether seal needs no look at the cache's
	// head, so that a commit seals before it queues for the cache's lock.
	sealsUnlocked() bool
	// seal unmounts the volume and readies its layer: nil for a volume
	// without changes, an *overLimitError for one past its limit.
	seal(r *volumeRecord) (*LayerInfo, error)
	// push makes layer, sealed from r, the newest of h.
	push(h *head, layer LayerInfo, r *volumeRecord)
	// end deletes what an ended volume leaves that nothing names now;
	// replaced is the layer its commit's head replaced as the newest
	// ("" for none), landed whether its own layer is in the head. Best
	// effort: the sweep deletes whatever a failure or a crash leaves.
	end(r *volumeRecord, replaced string, landed bool)
	// upperDir is where the volume's build writes.
	upperDir(r *volumeRecord) string
	// changed tells whether the build wrote anything a commit would keep
	// (anything but the control directory).
	changed(r *volumeRecord) (bool, error)
	// mountCommand is the mount(8) equivalent of the volume's mount.
	mountCommand(r *volumeRecord) string
	// space is a path on the filesystem the layout's caches take.
	space() string
	// sweep deletes what no head and no volume record names.
	sweep(ctx context.Context) (sweepResult, error)
	// exportDir is where layer id's tree is read for its image
	// (ExportLayer), ready to be read.
	exportDir(ctx context.Context, id string) (string, error)
	// squashes tells whether a deep head is squashed.
	squashes() bool
}

// layoutOf is the layout that keeps caches of layout l.
func (s *Store) layoutOf(l Layout) volumeLayout {
	if l.orDefault() == LayoutSnapshot {
		return snapshotLayout{s}
	}
	return overlayLayout{s}
}

// layouts are every layout a store composes.
func (s *Store) layouts() []volumeLayout {
	return []volumeLayout{overlayLayout{s}, snapshotLayout{s}}
}

// checkMountLayout refuses to mount a cache with a layout other than its
// own.
func checkMountLayout(t *txn, opts MountOptions) error {
	switch {
	case t.Head != nil:
		return checkLayout(opts.Cache, t.Head.Layout, opts.Layout)
	case t.Volume != nil:
		return checkLayout(opts.Cache, t.Volume.Layout, opts.Layout)
	}
	return nil
}
