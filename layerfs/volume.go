package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// volume states recorded in volume.json
const (
	stateMounted    = "mounted"
	stateCommitting = "committing" // the upper dir is being turned into CommitLayer
)

// volumeRecord is volumes/<id>/volume.json.
type volumeRecord struct {
	Volume
	CacheUID    string      `json:"cacheUID"`
	State       string      `json:"state"`
	CommitLayer *LayerInfo  `json:"commitLayer,omitempty"`
	RootMode    os.FileMode `json:"rootMode"`
	RootUID     int         `json:"rootUID"`
	RootGID     int         `json:"rootGID"`
	// Lifted mount restrictions (MountOptions); records of older versions
	// lack them, so their remounts get the new, safer default.
	AllowSetuid  bool `json:"allowSetuid,omitempty"`
	AllowDevices bool `json:"allowDevices,omitempty"`
	// BootID is the kernel boot the volume was last mounted in; a volatile
	// mount marker found after another boot means a possibly torn upper.
	BootID string `json:"bootID,omitempty"`
}

func (s *Store) upperDir(id string) string  { return filepath.Join(s.volumeDir(id), "upper") }
func (s *Store) workDir(id string) string   { return filepath.Join(s.volumeDir(id), "work") }
func (s *Store) mergedDir(id string) string { return filepath.Join(s.volumeDir(id), "merged") }

func (s *Store) volumeSpec(r *volumeRecord) mountSpec {
	return mountSpec{
		Lower: s.lowerDirs(r.Layers), Upper: s.upperDir(r.ID), Work: s.workDir(r.ID),
		AllowSetuid: r.AllowSetuid, AllowDevices: r.AllowDevices,
	}
}

func (s *Store) readVolume(id string) (*volumeRecord, error) {
	var r volumeRecord
	if err := readJSON(s.volumePath(id), &r); err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("volume %q: %w", id, ErrNotFound)
		}
		return nil, err
	}
	r.MergedPath = s.mergedDir(id)
	r.Mounted = isMountPoint(r.MergedPath)
	return &r, nil
}

// Mount creates volume volumeID as a copy-on-write view of opts.Cache and
// mounts it; an unknown cache starts empty. Mounting an existing volume again
// returns it, remounting it if its mount is gone (after a reboot).
func (s *Store) Mount(ctx context.Context, volumeID string, opts MountOptions) (*Volume, error) {
	if err := ValidateName("volume", volumeID); err != nil {
		return nil, err
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Mode == 0 {
		opts.Mode = 0o777
	}
	storeLock, err := s.lockStore(ctx, false)
	if err != nil {
		return nil, err
	}
	defer storeLock.unlock()
	volLock, err := s.lockVolume(ctx, volumeID)
	if err != nil {
		return nil, err
	}
	if r, err := s.readVolume(volumeID); err == nil {
		defer volLock.unlock()
		if r.Cache != opts.Cache {
			return nil, fmt.Errorf("volume %q already exists for cache %s, not %s: use another volume name", volumeID, r.Cache, opts.Cache)
		}
		if err := s.ensureMounted(ctx, r); err != nil {
			return nil, err
		}
		return &r.Volume, nil
	} else if !errors.Is(err, ErrNotFound) {
		volLock.unlock()
		return nil, err
	}
	r, err := s.newVolume(ctx, volumeID, opts)
	if err != nil {
		volLock.removeAndUnlock()
		return nil, err
	}
	volLock.unlock()
	return &r.Volume, nil
}

// MaxID is the largest uid or gid a volume root can have: ids are 32-bit,
// and 4294967295 means "unchanged" to chown(2).
const MaxID = 1<<32 - 2

// rootModeBits are the mode bits a volume root may have: permissions, and
// setgid (new files take the directory's group) and sticky (a shared /tmp).
// setuid means nothing on a directory.
const rootModeBits = os.ModePerm | os.ModeSetgid | os.ModeSticky

// Validate checks the options as Mount does, so that a caller (the CLI)
// can refuse bad input before doing any work.
func (o MountOptions) Validate() error {
	if err := o.Cache.Validate(); err != nil {
		return err
	}
	for _, id := range []struct {
		name  string
		value int
	}{{"uid", o.UID}, {"gid", o.GID}} {
		if id.value < 0 || id.value > MaxID {
			return fmt.Errorf("volume root %s %d is out of range: use 0 to %d", id.name, id.value, MaxID)
		}
	}
	if o.LimitBytes < 0 {
		return fmt.Errorf("volume size limit %d is negative: use a number of bytes, or 0 for no limit", o.LimitBytes)
	}
	if o.Mode&^rootModeBits != 0 {
		return fmt.Errorf("volume root mode 0%o is not allowed: use permission bits, optionally with setgid or sticky, like 0777, 0755, 02775 or 01777 (setuid means nothing on a directory)", unixMode(o.Mode))
	}
	return nil
}

// unixMode is m as chmod(2) bits, for messages.
func unixMode(m os.FileMode) uint32 {
	bits := uint32(m.Perm())
	for flag, bit := range map[os.FileMode]uint32{os.ModeSetuid: 0o4000, os.ModeSetgid: 0o2000, os.ModeSticky: 0o1000} {
		if m&flag != 0 {
			bits |= bit
		}
	}
	return bits
}

// ensureMounted mounts the volume unless it is mounted. It asks the mount
// table, not r.Mounted: a failed operation may have unmounted the volume
// after r was read. A volume left mid-commit is rolled back to a mounted
// volume first (see abortCommit).
func (s *Store) ensureMounted(ctx context.Context, r *volumeRecord) error {
	if r.State == stateCommitting {
		return s.abortCommit(ctx, r)
	}
	if isMountPoint(r.MergedPath) {
		r.Mounted = true
		return nil
	}
	if err := s.checkTorn(r); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	// A volatile overlay leaves a marker in its work directory, and the
	// kernel refuses to mount over it until it is reset.
	if err := resetDir(s.workDir(r.ID)); err != nil {
		return fmt.Errorf("remount volume %q: reset work directory: %w", r.ID, err)
	}
	if err := s.readyLayers(r.Layers); err != nil {
		return fmt.Errorf("remount volume %q: %w", r.ID, err)
	}
	if err := s.withReserve(func() error { return s.volumeSpec(r).mount(r.MergedPath) }); err != nil {
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
func (s *Store) volatileMarker(id string) string {
	return filepath.Join(s.workDir(id), "work", "incompat", "volatile")
}

// checkTorn finds a volume whose upper layer a crash may have torn, before
// the remount erases the evidence. It records that first (atomically), then
// empties the upper layer: the volume stays usable, but is never committed.
func (s *Store) checkTorn(r *volumeRecord) error {
	boot := bootID()
	if r.BootID == boot || !exists(s.volatileMarker(r.ID)) {
		return nil
	}
	torn := *r
	torn.Torn, torn.BootID, torn.Mounted = true, boot, false
	if err := s.withReserve(func() error { return writeJSONAtomic(s.volumePath(r.ID), &torn) }); err != nil {
		return fmt.Errorf("record that its upper layer may be torn: %w", err)
	}
	r.Torn, r.BootID = true, boot
	if err := resetDir(s.upperDir(r.ID)); err != nil {
		return fmt.Errorf("empty its possibly torn upper layer: %w", err)
	}
	return nil
}

// bootID names the running kernel's boot.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
})

// abortCommit turns a volume whose commit failed before its layer landed
// back into a mounted volume with its upper layer, as the design promises
// ("a failed commit keeps the volume mounted"), so that neither a retry nor
// a Mount needs a manual recover. It goes by the record on disk: a failed
// write may have left either state there. Callers hold the volume lock.
func (s *Store) abortCommit(ctx context.Context, r *volumeRecord) error {
	onDisk, err := s.readVolume(r.ID)
	if err != nil {
		return err
	}
	if onDisk.State == stateCommitting {
		if err := s.undoCommitIntent(ctx, onDisk); err != nil {
			return err
		}
	}
	*r = *onDisk
	r.State, r.CommitLayer = stateMounted, nil
	return s.ensureMounted(ctx, r)
}

// undoCommitIntent moves a commit's layer back to the volume's upper
// directory and records the volume as mounted. If the layer is already in
// the head, the commit is past its point of no return and only a retry of
// Commit (or Recover) can finish it. A crash in between leaves the intent
// recorded with the upper directory in place, which a retry rolls forward.
func (s *Store) undoCommitIntent(ctx context.Context, r *volumeRecord) error {
	if l := r.CommitLayer; l != nil {
		h, cacheLock, err := s.lockHead(ctx, r.Cache)
		if err != nil {
			return err
		}
		defer cacheLock.unlock()
		if h != nil && h.UID == r.CacheUID && h.hasLayer(l.ID) {
			return fmt.Errorf("volume %q: its commit already landed as layer %s; retry the commit to finish it", r.ID, l.ID)
		}
		if !exists(s.upperDir(r.ID)) && exists(s.layerDir(l.ID)) {
			if err := renameDurable(s.layerDir(l.ID), s.upperDir(r.ID)); err != nil {
				return fmt.Errorf("volume %q: move its layer back to the upper directory: %w", r.ID, err)
			}
		}
	}
	back := *r
	back.State, back.CommitLayer, back.Mounted = stateMounted, nil, false
	// The upper layer was synced before the intent was recorded, so no
	// crash since can have torn it, whatever the volatile marker says.
	back.BootID = bootID()
	if err := s.withReserve(func() error { return writeJSONAtomic(s.volumePath(r.ID), &back) }); err != nil {
		return fmt.Errorf("volume %q: record the end of its failed commit (a retry of the commit finishes it instead): %w", r.ID, err)
	}
	*r = back
	return nil
}

// newVolume builds the volume directory next to its final place, renames it
// in, then mounts; on any failure nothing of it remains. It holds the
// cache's lock until the volume is recorded, so that whoever decides under
// that lock whether the cache is in use (GC, RemoveIfUnused) sees it.
func (s *Store) newVolume(ctx context.Context, id string, opts MountOptions) (rec *volumeRecord, err error) {
	cacheLock, err := s.lockCache(ctx, opts.Cache)
	if err != nil {
		return nil, err
	}
	defer cacheLock.unlock()
	h, err := s.touchHead(opts.Cache)
	if err != nil {
		return nil, err
	}
	r := &volumeRecord{
		Volume: Volume{
			ID: id, Cache: opts.Cache, ReadOnly: opts.ReadOnly, Writer: opts.Writer,
			BaseGeneration: h.Generation, Layers: h.layerIDs(), Created: time.Now().UTC(),
			LimitBytes: opts.LimitBytes,
		},
		CacheUID: h.UID, State: stateMounted, BootID: bootID(),
		RootMode: opts.Mode, RootUID: opts.UID, RootGID: opts.GID,
		AllowSetuid: opts.AllowSetuid, AllowDevices: opts.AllowDevices,
	}
	tmp, err := os.MkdirTemp(s.volumesDir(), "new-")
	if err != nil {
		return nil, fmt.Errorf("create volume %q: %w", id, err)
	}
	final := s.volumeDir(id)
	defer func() {
		if err != nil {
			if tmp != "" {
				os.RemoveAll(tmp)
			}
			unmount(s.mergedDir(id))
			os.RemoveAll(final)
		}
	}()
	if err = s.buildVolumeDir(tmp, r); err != nil {
		return nil, fmt.Errorf("create volume %q: %w", id, err)
	}
	if err = renameDurable(tmp, final); err != nil {
		return nil, fmt.Errorf("create volume %q: %w", id, err)
	}
	tmp = ""
	r.MergedPath = s.mergedDir(id)
	if err = s.readyLayers(r.Layers); err != nil {
		return nil, fmt.Errorf("mount volume %q: %w", id, err)
	}
	if err = s.volumeSpec(r).mount(r.MergedPath); err != nil {
		return nil, fmt.Errorf("mount volume %q: %w", id, err)
	}
	r.Mounted = true
	return r, nil
}

func (s *Store) buildVolumeDir(dir string, r *volumeRecord) error {
	for _, sub := range []string{"upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	// The merged root takes the upper root's owner and mode.
	upper := filepath.Join(dir, "upper")
	if err := os.Chown(upper, r.RootUID, r.RootGID); err != nil {
		return err
	}
	if err := os.Chmod(upper, r.RootMode); err != nil {
		return err
	}
	return writeJSONAtomic(filepath.Join(dir, "volume.json"), r)
}

// lastUsedGranularity is how stale a cache's recorded last use may be.
const lastUsedGranularity = time.Minute

// touchHead records a use of the cache, creating it if needed, and returns
// its head. Callers hold the cache lock.
func (s *Store) touchHead(c CacheRef) (*head, error) {
	h, err := s.readHead(c)
	now := time.Now().UTC()
	switch {
	case errors.Is(err, ErrNotFound):
		h = &head{Cache: c, UID: randomID(), Created: now}
	case err != nil:
		return nil, fmt.Errorf("cache %s: %w", c, err)
	case now.Sub(h.LastUsed) < lastUsedGranularity:
		return h, nil // recent enough for GC; spare the hot path two fsyncs
	}
	h.LastUsed = now
	if err := s.writeHead(h); err != nil {
		return nil, fmt.Errorf("record use of cache %s: %w", c, err)
	}
	return h, nil
}

// Commit unmounts the volume and makes its upper directory the cache's
// newest layer. A volume without changes adds no layer. If anything fails
// the upper directory is kept and the volume stays (re)mounted, so the
// commit can be retried.
func (s *Store) Commit(ctx context.Context, volumeID string) (CommitResult, error) {
	if err := ValidateName("volume", volumeID); err != nil {
		return CommitResult{}, err
	}
	res, r, err := s.commit(ctx, volumeID)
	if err == nil {
		s.sweepIfOrphaned(r)
	}
	return res, err
}

func (s *Store) commit(ctx context.Context, volumeID string) (res CommitResult, ended *volumeRecord, err error) {
	storeLock, err := s.lockStore(ctx, false)
	if err != nil {
		return CommitResult{}, nil, err
	}
	defer storeLock.unlock()
	err = s.withVolume(ctx, volumeID, func(r *volumeRecord) (gone bool, err error) {
		if r.ReadOnly {
			return false, fmt.Errorf("volume %q is a read-only view of cache %s and cannot be committed; discard it", volumeID, r.Cache)
		}
		if res, err = s.commitLocked(ctx, r); err != nil {
			return false, err
		}
		ended = r
		return true, nil
	})
	return res, ended, err
}

// commitLocked commits (or, torn or over its limit, discards) a volume
// whose lock the caller holds; on success the volume is gone.
func (s *Store) commitLocked(ctx context.Context, r *volumeRecord) (CommitResult, error) {
	if r.Torn {
		return s.discardTorn(r)
	}
	if r.State != stateCommitting {
		err := s.prepareCommit(ctx, r)
		var over *overLimitError
		if errors.As(err, &over) {
			res := CommitResult{Cache: r.Cache, OverLimit: true, Bytes: over.bytes}
			return res, s.discardInstead(r, &res)
		}
		if err != nil {
			return CommitResult{}, err
		}
	}
	res, err := s.finishCommit(ctx, r)
	if err != nil {
		// Keep the volume usable; if even that fails (a full disk), the
		// recorded intent lets a retry finish the commit.
		if aerr := s.abortCommit(ctx, r); aerr != nil {
			err = fmt.Errorf("%w (the volume stays unmounted until the commit is retried: %v)", err, aerr)
		}
	}
	return res, err
}

// discardTorn ends a torn volume as Discard does and reports the cache as
// it stands.
func (s *Store) discardTorn(r *volumeRecord) (CommitResult, error) {
	res := CommitResult{Cache: r.Cache, Torn: true}
	err := s.discardInstead(r, &res)
	return res, err
}

// discardInstead ends a volume that may not be committed as Discard does,
// and sets res.Generation to the cache's as it stands.
func (s *Store) discardInstead(r *volumeRecord, res *CommitResult) error {
	if err := unmount(r.MergedPath); err != nil {
		return fmt.Errorf("discard volume %q: %w", r.ID, err)
	}
	if err := s.removeVolumeDir(r.ID); err != nil {
		return err
	}
	if h, err := s.readHead(r.Cache); err == nil {
		res.Generation = h.Generation
	}
	return nil
}

// overLimitError is a volume whose changes are larger than its limit.
type overLimitError struct{ bytes, limit int64 }

func (e *overLimitError) Error() string {
	return fmt.Sprintf("the volume's changes take %d bytes, more than its limit of %d", e.bytes, e.limit)
}

// prepareCommit unmounts the volume and records the commit's intent, so that
// a crash from here on is rolled forward by Recover.
func (s *Store) prepareCommit(ctx context.Context, r *volumeRecord) (err error) {
	if err := unmount(r.MergedPath); err != nil {
		return fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	defer func() {
		var over *overLimitError
		if err != nil && !errors.As(err, &over) {
			s.abortCommit(ctx, r) // best effort: the caller can retry either way
		}
	}()
	empty, err := upperIsEmpty(s.upperDir(r.ID))
	if err != nil {
		return fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	r.State = stateCommitting
	if !empty {
		// The volume was mounted volatile: its data reaches the disk here,
		// before any record points at it. One syncfs beats an fsync per
		// file for the thousands of small files a build writes.
		if err := syncFS(s.upperDir(r.ID)); err != nil {
			return fmt.Errorf("commit volume %q: %w", r.ID, err)
		}
		bytes, files, err := diskUsage(s.upperDir(r.ID))
		if err != nil {
			return fmt.Errorf("commit volume %q: measure upper layer: %w", r.ID, err)
		}
		if r.LimitBytes > 0 && bytes > r.LimitBytes {
			// Nothing is recorded yet, so the volume is still mounted as
			// far as a crash is concerned; the caller discards it.
			return &overLimitError{bytes: bytes, limit: r.LimitBytes}
		}
		r.CommitLayer = &LayerInfo{ID: randomID(), Bytes: bytes, Files: files, Created: time.Now().UTC()}
	}
	r.Mounted = false
	if err := writeJSONAtomic(s.volumePath(r.ID), r); err != nil {
		return fmt.Errorf("commit volume %q: %w", r.ID, err)
	}
	return nil
}

// finishCommit moves the upper dir into layers/ and appends it to the head.
// Every step checks whether it already happened, so it can be replayed after
// a crash at any point.
func (s *Store) finishCommit(ctx context.Context, r *volumeRecord) (CommitResult, error) {
	h, cacheLock, err := s.lockHead(ctx, r.Cache)
	if err != nil {
		return CommitResult{}, err
	}
	defer cacheLock.unlock()
	if h == nil || h.UID != r.CacheUID {
		res := CommitResult{Cache: r.Cache, Dropped: true}
		// The cache was removed while the volume was in use: the removal
		// asked for its contents to go, so this volume's changes go too.
		if r.CommitLayer != nil && (h == nil || !h.hasLayer(r.CommitLayer.ID)) {
			os.RemoveAll(s.layerDir(r.CommitLayer.ID))
		}
		return res, s.removeVolumeDir(r.ID)
	}
	res := CommitResult{Cache: r.Cache, Generation: h.Generation}
	if l := r.CommitLayer; l != nil {
		res.Layer, res.Bytes = l.ID, l.Bytes
		if !h.hasLayer(l.ID) {
			if err := s.landLayer(r, h); err != nil {
				return CommitResult{}, err
			}
		}
		res.Generation = h.Generation
	}
	res.NeedsSquash = len(h.Layers) > s.opts.MaxLayers
	return res, s.removeVolumeDir(r.ID)
}

func (s *Store) landLayer(r *volumeRecord, h *head) error {
	l := r.CommitLayer
	if _, err := os.Lstat(s.layerDir(l.ID)); errors.Is(err, os.ErrNotExist) {
		// Stripped here, after the intent is recorded, rather than before
		// the build's pods ended or the agent decided: a crash until now
		// keeps the markers that decided to commit.
		if err := stripControlDir(s.upperDir(r.ID)); err != nil {
			return fmt.Errorf("commit volume %q: %w", r.ID, err)
		}
		if err := renameDurable(s.upperDir(r.ID), s.layerDir(l.ID)); err != nil {
			return fmt.Errorf("commit volume %q: move upper layer into the store: %w", r.ID, err)
		}
	}
	h.Layers = append([]LayerInfo{*l}, h.Layers...)
	h.Generation++
	h.LastUsed = time.Now().UTC()
	h.LastWriter = r.Writer
	if h.LastWriter == "" {
		h.LastWriter = r.ID
	}
	if err := s.writeHead(h); err != nil {
		// The layer stays at its final place; the recorded intent lets a
		// retry or Recover append it.
		return fmt.Errorf("commit volume %q: write head of cache %s: %w", r.ID, r.Cache, err)
	}
	return nil
}

// Discard unmounts and removes the volume; its changes are lost. A volume
// caught mid-commit is rolled back unless its layer already landed.
func (s *Store) Discard(ctx context.Context, volumeID string) error {
	if err := ValidateName("volume", volumeID); err != nil {
		return err
	}
	var ended *volumeRecord
	err := s.withVolume(ctx, volumeID, func(r *volumeRecord) (bool, error) {
		if err := unmount(r.MergedPath); err != nil {
			return false, fmt.Errorf("discard volume %q: %w", volumeID, err)
		}
		if r.State == stateCommitting && r.CommitLayer != nil {
			if err := s.rollBackCommit(ctx, r); err != nil {
				return false, err
			}
		}
		if err := s.removeVolumeDir(volumeID); err != nil {
			return false, err
		}
		ended = r
		return true, nil
	})
	if err != nil {
		return err
	}
	s.sweepIfOrphaned(ended)
	return nil
}

// withVolume runs fn on the record of volume id under the volume's lock,
// as containerd's snapshotters run a change in one transaction: the lock
// is released on every path, and its file goes with the volume when fn
// says the volume is gone, or when there is no such volume (so unknown
// names leave no trace).
func (s *Store) withVolume(ctx context.Context, id string, fn func(r *volumeRecord) (gone bool, err error)) error {
	l, err := s.lockVolume(ctx, id)
	if err != nil {
		return err
	}
	r, err := s.readVolume(id)
	if err != nil {
		releaseOnError(l, err)
		return err
	}
	gone, err := fn(r)
	if gone {
		l.removeAndUnlock()
	} else {
		l.unlock()
	}
	return err
}

// releaseOnError releases a lock after a failed lookup; the lock file of an
// object that does not exist is removed so unknown names leave no trace.
func releaseOnError(l *fileLock, err error) {
	if errors.Is(err, ErrNotFound) {
		l.removeAndUnlock()
		return
	}
	l.unlock()
}

// sweepIfOrphaned removes the layers an ended volume was the last user of
// (its cache was squashed or removed meanwhile). It never waits: if another
// operation holds the store, the next sweep or GC removes them.
func (s *Store) sweepIfOrphaned(r *volumeRecord) {
	h, err := s.readHead(r.Cache)
	for _, id := range r.Layers {
		if err != nil || !h.hasLayer(id) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // one attempt at the lock, no waiting
			s.sweepLayers(ctx)
			return
		}
	}
}

// lockHead takes the cache's lock and reads its head, nil if the cache does
// not exist. The caller unlocks.
func (s *Store) lockHead(ctx context.Context, c CacheRef) (*head, *fileLock, error) {
	l, err := s.lockCache(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	h, err := s.readHead(c)
	if errors.Is(err, ErrNotFound) {
		return nil, l, nil
	}
	if err != nil {
		l.unlock()
		return nil, nil, err
	}
	return h, l, nil
}

func (s *Store) rollBackCommit(ctx context.Context, r *volumeRecord) error {
	h, cacheLock, err := s.lockHead(ctx, r.Cache)
	if err != nil {
		return err
	}
	defer cacheLock.unlock()
	if h == nil || !h.hasLayer(r.CommitLayer.ID) {
		return os.RemoveAll(s.layerDir(r.CommitLayer.ID))
	}
	return nil
}

// removeVolumeDir removes a volume's directory. The record goes first, so
// a crash midway leaves no half volume that Volumes would report; Recover
// removes the rest. Not fsynced: a removal that a crash undoes is replayed
// by the caller, and every caller's operation is idempotent.
func (s *Store) removeVolumeDir(id string) error {
	dir := s.volumeDir(id)
	faultPoint()
	if err := os.Remove(s.volumePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove volume %q: %w", id, err)
	}
	faultPoint()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove volume %q: %w", id, err)
	}
	return nil
}

// Volume reports one volume.
func (s *Store) Volume(ctx context.Context, volumeID string) (*Volume, error) {
	if err := ValidateName("volume", volumeID); err != nil {
		return nil, err
	}
	r, err := s.readVolume(volumeID)
	if err != nil {
		return nil, err
	}
	return &r.Volume, nil
}

// Volumes reports every volume, sorted by id.
func (s *Store) Volumes(ctx context.Context) ([]Volume, error) {
	recs, err := s.volumeRecords()
	if err != nil {
		return nil, err
	}
	vols := make([]Volume, len(recs))
	for i, r := range recs {
		vols[i] = r.Volume
	}
	return vols, nil
}

func (s *Store) volumeRecords() ([]*volumeRecord, error) {
	entries, err := os.ReadDir(s.volumesDir())
	if err != nil {
		return nil, err
	}
	var recs []*volumeRecord
	for _, e := range entries {
		if isTemp(e.Name()) || ValidateName("volume", e.Name()) != nil {
			continue
		}
		r, err := s.readVolume(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue // being created or removed
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].ID < recs[j].ID })
	return recs, nil
}

// MountCommand returns the `mount -t overlay ...` line equivalent to the
// volume's mount, for debugging.
func (s *Store) MountCommand(ctx context.Context, volumeID string) (string, error) {
	if err := ValidateName("volume", volumeID); err != nil {
		return "", err
	}
	r, err := s.readVolume(volumeID)
	if err != nil {
		return "", err
	}
	return s.volumeSpec(r).command(r.MergedPath), nil
}

// resetDir empties dir, keeping dir itself. It reads dirChunk names at a
// time (a torn upper layer may hold a huge directory) and removes only
// names it has read, which readdir returns once each however the directory
// changes meanwhile.
func resetDir(dir string) error {
	d, err := openDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return forEachName(d, dir, func(name string) error {
		return os.RemoveAll(filepath.Join(dir, name))
	})
}
