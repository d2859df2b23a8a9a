package layerfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/tree"
)

// The overlay layout: a cache is a stack of overlay layers (layers/<id>),
// a volume an overlay mount of its cache's layers under an upper
// directory born where its layer will live, so that a commit moves
// nothing. Its layers travel through a registry (chain.go, sync.go) and a
// deep stack is squashed (squash.go).

// overlayLayout is the overlay layout of a store (see volumeLayout).
type overlayLayout struct{ *Store }

func (s overlayLayout) sealsUnlocked() bool { return true }

func (s overlayLayout) push(h *head, layer LayerInfo, r *volumeRecord) { h.push(layer, r) }

// end removes the upper directory of a volume whose layer did not land:
// named by nothing now; else the sweep removes it.
func (s overlayLayout) end(r *volumeRecord, _ string, landed bool) {
	if !landed && r.Upper != "" {
		os.RemoveAll(s.layerDir(r.Upper))
	}
}

func (s overlayLayout) upperDir(r *volumeRecord) string { return s.layerDir(r.Upper) }

func (s overlayLayout) mountCommand(r *volumeRecord) string {
	return s.volumeSpec(r).Command(r.MergedPath)
}

// space is the store root's filesystem, where layers live.
func (s overlayLayout) space() string { return s.root }

// exportDir mounts the layer's image first if it was pulled: its
// mount is gone after a reboot until Recover runs.
func (s overlayLayout) exportDir(_ context.Context, id string) (string, error) {
	if err := s.readyLayers([]string{id}); err != nil {
		return "", err
	}
	return s.layerDir(id), nil
}

func (s overlayLayout) squashes() bool { return true }

// remount mounts an overlay volume again, emptying its upper layer if a
// crash may have torn it (checkTorn).
func (s overlayLayout) remount(t *txn) error {
	r := t.Volume
	if err := s.checkTorn(t); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	// A volatile overlay leaves a marker in its work directory, and the
	// kernel refuses to mount over it until it is reset.
	if err := tree.Empty(s.workDir(r.ID)); err != nil {
		return fmt.Errorf("remount volume %q: reset work directory: %w", r.ID, err)
	}
	if err := s.readyLayers(r.Layers); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	r.LazyLayers = s.lazilyRead(r.Layers)
	if err := s.withReserve(func() error { return s.volumeSpec(r).Mount(r.MergedPath) }); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	r.Mounted = true
	return nil
}

// volatileMarker is what the kernel leaves in a volatile overlay's work
// directory. It stays after a clean unmount too (Linux 6.18), so it alone
// does not tell a crash; together with a different boot it does: the node
// went down while the volume was mounted, and what the kernel had not yet
// written of the upper layer is lost.
func (s overlayLayout) volatileMarker(id string) string {
	return filepath.Join(s.workDir(id), "work", "incompat", "volatile")
}

// checkTorn finds a volume whose upper layer a crash may have torn, before
// the remount erases the evidence. It records that first (atomically), then
// empties the upper layer: the volume stays usable, but is never committed.
func (s overlayLayout) checkTorn(t *txn) error {
	r := t.Volume
	boot := bootID()
	if r.BootID == boot || !ondisk.Exists(s.volatileMarker(r.ID)) {
		return nil
	}
	r.Torn, r.BootID, r.Mounted = true, boot, false
	if err := t.save(); err != nil {
		return fmt.Errorf("record that its upper layer may be torn: %w", err)
	}
	if err := tree.Empty(s.upperDir(r)); err != nil {
		return fmt.Errorf("empty its possibly torn upper layer: %w", err)
	}
	return nil
}

// create creates the volume's directories, its upper directory at its
// home as a layer, records the volume, then mounts it; on any failure
// nothing of it remains (a crash leaves what Recover and the sweep remove).
func (s overlayLayout) create(t *txn, id string, opts MountOptions) (err error) {
	seed, seedLayers, err := s.seedFor(t, opts)
	if err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	r := &volumeRecord{
		Volume: Volume{
			ID: id, Cache: opts.Cache, ReadOnly: opts.ReadOnly, Writer: opts.Writer,
			Created: time.Now().UTC(), LimitBytes: opts.LimitBytes, MergedPath: s.mergedDir(id),
			Labels: opts.Labels,
		},
		Upper: randomID(), BootID: bootID(),
		RootMode: opts.Mode, RootUID: opts.UID, RootGID: opts.GID,
		AllowSetuid: opts.AllowSetuid, AllowDevices: opts.AllowDevices,
	}
	if seed != nil {
		t.seedVolume(r, seed, seedLayers)
	} else {
		t.touchHead()
		r.BaseGeneration, r.Layers, r.CacheUID = t.Head.Generation, t.Head.layerIDs(), t.Head.UID
	}
	defer func() {
		if err != nil {
			ondisk.Unmount(r.MergedPath)
			t.Volume = nil
			t.save() // best effort; Recover removes what is left
			os.RemoveAll(s.layerDir(r.Upper))
			os.RemoveAll(s.volumeDir(id))
		}
	}()
	if err := s.makeVolumeDirs(r); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	r.LazyLayers = s.lazilyRead(r.Layers)
	t.Volume = r
	if err := t.save(); err != nil {
		return fmt.Errorf("create volume %q: %w", id, err)
	}
	if err := s.readyLayers(r.Layers); err != nil {
		return fmt.Errorf("mount volume %q: %w", id, err)
	}
	if err := s.volumeSpec(r).Mount(r.MergedPath); err != nil {
		return fmt.Errorf("mount volume %q: %w", id, err)
	}
	r.Mounted = true
	return nil
}

// makeVolumeDirs creates the volume's work and merged directories and its
// upper directory, which takes the volume root's owner and mode (the
// merged root shows the upper root's).
func (s overlayLayout) makeVolumeDirs(r *volumeRecord) error {
	if err := s.freshVolumeDir(r.ID); err != nil {
		return err
	}
	upper := s.upperDir(r)
	for _, dir := range []string{s.workDir(r.ID), r.MergedPath, upper} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chown(upper, r.RootUID, r.RootGID); err != nil {
		return err
	}
	return os.Chmod(upper, r.RootMode)
}

// seal unmounts the volume and readies its upper directory to be a layer:
// the control directory moved aside, the data on disk, the size measured.
// layer is nil for a volume without changes.
func (s overlayLayout) seal(r *volumeRecord) (layer *LayerInfo, err error) {
	if err := ondisk.Unmount(r.MergedPath); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	upper := s.upperDir(r)
	if err := s.moveControlAside(r.ID, upper); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	if empty, err := upperIsEmpty(upper); err != nil || empty {
		return nil, err
	}
	// The volume was mounted volatile: its data reaches the disk here,
	// before the head points at it. One syncfs beats an fsync per file
	// for the thousands of small files a build writes, and concurrent
	// commits share it.
	if err := s.syncs.Sync(upper); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	if err := s.clearVolatileMarker(r.ID); err != nil {
		return nil, fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	bytes, files, err := tree.DiskUsage(upper)
	if err != nil {
		return nil, fmt.Errorf("commit volume %q: measure upper layer: %w", r.ID, err)
	}
	if r.LimitBytes > 0 && bytes > r.LimitBytes {
		return nil, &overLimitError{bytes: bytes, limit: r.LimitBytes}
	}
	return &LayerInfo{ID: r.Upper, Bytes: bytes, Files: files, Created: time.Now().UTC()}, nil
}

// clearVolatileMarker removes the kernel's mark of a volatile mount, once
// the upper layer is on disk: a remount after a crash from here on must not
// take the synced layer for torn (see checkTorn).
func (s overlayLayout) clearVolatileMarker(id string) error {
	marker := s.volatileMarker(id)
	if !ondisk.Exists(marker) {
		return nil
	}
	ondisk.FaultPoint()
	if err := os.RemoveAll(marker); err != nil {
		return fmt.Errorf("remove the volatile mount marker: %w", err)
	}
	return ondisk.SyncDir(filepath.Dir(marker))
}

// moveControlAside moves the upper directory's control directory next to
// the volume's record, durably, rather than deleting it: a crash before
// the head is written leaves the volume with the markers that decided to
// commit it (wroteControlFile still finds them), and none inside the layer.
// A retry finds the first markers already aside and drops the new ones.
func (s overlayLayout) moveControlAside(id, upper string) error {
	dir := filepath.Join(upper, ControlDir)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if !ondisk.Exists(s.controlAside(id)) {
		if err := ondisk.RenameDurable(dir, s.controlAside(id)); err != nil {
			return fmt.Errorf("move the control directory %s aside: %w", ControlDir, err)
		}
		return nil
	}
	return stripControlDir(upper)
}

// changed tells whether an overlay volume's upper layer holds more than
// the control directory.
func (s overlayLayout) changed(r *volumeRecord) (bool, error) {
	empty, err := upperIsEmpty(s.upperDir(r))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return !empty, err
}

// upperIsEmpty reports whether an upper layer holds nothing but the control
// directory: such a volume commits no layer.
func upperIsEmpty(upper string) (bool, error) {
	f, err := os.Open(upper)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(2)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return len(names) == 1 && names[0] == ControlDir, nil
}

// sweep removes every directory under layers/ and images/ that no head
// and no volume references, including temp dirs of crashed builds. It
// holds the store lock exclusively only while it moves them aside;
// deleting their contents happens after.
func (s overlayLayout) sweep(ctx context.Context) (sweepResult, error) {
	var res sweepResult
	trash, err := s.moveUnreferenced(ctx)
	if err != nil {
		return res, err
	}
	var errs []error // one that cannot go never keeps the rest
	for i, dir := range trash {
		bytes := onDisk(dir)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove unreferenced layer: %w", err))
			continue
		}
		res.RemovedLayers++
		res.FreedBytes += bytes
		s.progress(Progress{Op: "gc", Done: int64(i + 1), Total: int64(len(trash))})
	}
	return res, errors.Join(errs...)
}
