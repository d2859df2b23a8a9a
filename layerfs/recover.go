package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/moby/sys/mountinfo"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Recover repairs the store after a crash or reboot: it removes temp files
// and directories and what ended volumes left, moves volumes of the old
// layout to the current one (finishing the commits it recorded), remounts
// volumes whose mounts are gone, and removes layers nothing references. Run it at start-up, before serving.
//
// A volume that cannot be repaired (a full disk, a damaged record) does not
// stop the others: it is listed in RecoverResult.Failed, and the returned
// error joins those failures once everything else is done.
func (s *Store) Recover(ctx context.Context) (RecoverResult, error) {
	var res RecoverResult
	removed, err := s.removeTemp(ctx)
	if err != nil {
		return res, err
	}
	res.RemovedTemp = removed
	// Unreferenced layers go first: on a full disk, the space they free is
	// what remounts and commits need. What it cannot delete never keeps
	// the volumes from being repaired: the last sweep retries and reports.
	swept, _ := s.sweepLayers(ctx)
	res.RemovedLayers = swept.RemovedLayers
	if err := s.remountImages(ctx); err != nil {
		return res, fmt.Errorf("mount the layer images: %w", err)
	}
	recs, err := s.volumeRecords()
	if err != nil {
		return res, err
	}
	for _, r := range recs {
		if err := s.recoverVolume(ctx, r, &res); err != nil {
			res.Failed = append(res.Failed, VolumeError{Volume: r.ID, Err: err, Message: err.Error()})
		}
	}
	swept, err = s.sweepLayers(ctx)
	res.RemovedLayers += swept.RemovedLayers
	if err != nil {
		res.Unswept = err.Error()
	}
	res.Finished = true
	errs := []error{err}
	for _, f := range res.Failed {
		errs = append(errs, fmt.Errorf("recover volume %q: %w", f.Volume, f.Err))
	}
	return res, errors.Join(errs...)
}

// recoverVolume repairs one volume from a list read without its lock. The
// volume may have been discarded or committed since, so the decision is
// made again under its lock, and a volume that is gone stays gone: a
// Mount here would create it anew, owned by nobody.
func (s *Store) recoverVolume(ctx context.Context, listed *volumeRecord, res *RecoverResult) error {
	if listed.Mounted {
		return nil
	}
	return s.transact(ctx, scope{store: true, volume: listed.ID}, func(t *txn) error {
		if t.Volume == nil || t.Volume.Mounted {
			return nil // discarded, committed or remounted meanwhile
		}
		wasTorn := t.Volume.Torn
		if err := s.ensureMounted(t); err != nil {
			return err
		}
		res.Remounted = append(res.Remounted, t.Volume.ID)
		if t.Volume.Torn && !wasTorn {
			res.Torn = append(res.Torn, t.Volume.ID)
		}
		return nil
	})
}

// removeTemp removes what interrupted operations left: new-* builds, temp
// files of atomic writes, squash views and trash. It holds the store lock
// exclusively so that no operation in another process is building them.
func (s *Store) removeTemp(ctx context.Context) (int, error) {
	l, err := s.lockStore(ctx, true)
	if err != nil {
		return 0, err
	}
	defer l.Unlock()
	var leftovers []string
	for _, dir := range []string{s.layersDir(), s.volumesDir()} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return 0, err
		}
		for _, e := range entries {
			if isTemp(e.Name()) || (dir == s.volumesDir() && s.volumeEnded(e.Name())) {
				leftovers = append(leftovers, filepath.Join(dir, e.Name()))
			}
		}
	}
	tmps, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return 0, err
	}
	for _, e := range tmps {
		leftovers = append(leftovers, filepath.Join(s.tmpDir(), e.Name()))
	}
	leftovers = append(leftovers, s.atomicWriteLeftovers()...)
	for _, p := range leftovers {
		if err := unmountAll(p); err != nil {
			return 0, err
		}
		if err := os.RemoveAll(p); err != nil {
			return 0, fmt.Errorf("remove leftover %s: %w", p, err)
		}
	}
	return len(leftovers), nil
}

// volumeEnded tells a volume directory whose record is gone, or names a
// layer its cache holds: what a crash left of a Discard or Commit.
func (s *Store) volumeEnded(id string) bool {
	_, err := s.readVolume(id)
	return errors.Is(err, ErrNotFound)
}

// atomicWriteLeftovers finds .NAME.tmp-* files next to heads, volume
// records and partial layers' records and states.
func (s *Store) atomicWriteLeftovers() []string {
	var found []string
	for _, pattern := range []string{
		filepath.Join(s.cachesDir(), "*", "*", ".*.tmp-*"),
		filepath.Join(s.volumesDir(), "*", ".*.tmp-*"),
		filepath.Join(s.partialDir(), ".*.tmp-*"),
	} {
		m, _ := filepath.Glob(pattern)
		found = append(found, m...)
	}
	return found
}

// unmountAll unmounts every mount at or below dir (squash views of a
// crashed process), deepest first. mountinfo decodes the escaped fields of
// /proc/self/mountinfo (a space is "\040" there).
func unmountAll(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("read the mount table: %w", err)
	}
	// Deepest first; the table lists stacked mounts in mount order, which
	// the stable sort keeps, so the last one stacked goes first.
	slices.SortStableFunc(mounts, func(a, b *mountinfo.Info) int { return len(a.Mountpoint) - len(b.Mountpoint) })
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := ondisk.Unmount(mounts[i].Mountpoint); err != nil {
			return err
		}
	}
	return nil
}
