package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/tree"
)

// GC removes caches unused for longer than opts.MaxAge, then the least
// recently used caches while the store holds more than opts.MaxBytes or
// the filesystem they live on (volumeLayout.space) has less free space than
// opts.MinFreeBytes or opts.MinFreePercent, then every layer no cache or
// volume references.
// Caches a writable volume uses are kept; that is decided under each
// cache's lock.
func (s *Store) GC(ctx context.Context, opts GCOptions) (GCResult, error) {
	var res GCResult
	if err := opts.validate(); err != nil {
		return res, err
	}
	infos, err := s.List(ctx)
	if err != nil {
		return res, err
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].LastUsed.Before(infos[j].LastUsed) })
	size := newStoreSize(infos)
	now := time.Now()
	var sweepErrs []error
	for i, c := range infos {
		expired := opts.MaxAge > 0 && now.Sub(c.LastUsed) > opts.MaxAge
		over := opts.MaxBytes > 0 && size.total > opts.MaxBytes
		low, err := s.lowOnSpace(opts, s.layoutOf(c.Layout).space())
		if err != nil {
			return res, err
		}
		if !(expired || over || low) {
			continue
		}
		// Whether a volume holds the cache is decided under its lock.
		removed, err := s.removeIfUnused(ctx, c.Cache, c.LastUsed)
		if err != nil {
			return res, err
		}
		if !removed {
			continue
		}
		size.remove(c)
		res.RemovedCaches = append(res.RemovedCaches, c.Cache)
		s.progress(Progress{Op: "gc", Cache: c.Cache.String(), Done: int64(i + 1), Total: int64(len(infos))})
		if low {
			// Free space is measured, so the layers must go before the
			// next measurement. A sweep that could not delete something
			// has still deleted the rest: GC goes on, and reports it.
			sweepErrs = append(sweepErrs, s.sweepInto(ctx, &res))
		}
	}
	sweepErrs = append(sweepErrs, s.sweepInto(ctx, &res))
	s.refillReserve()
	return res, errors.Join(sweepErrs...)
}

// sweepInto runs sweepLayers and adds what it removed to res.
func (s *Store) sweepInto(ctx context.Context, res *GCResult) error {
	swept, err := s.sweepLayers(ctx)
	res.RemovedLayers += swept.RemovedLayers
	res.FreedBytes += swept.FreedBytes
	return err
}

// storeSize is what the caches take together, counting a layer that
// several caches share (a seeded cache and its fallback) once: removing
// one of them frees only the layers no other cache names.
type storeSize struct {
	total int64
	users map[string]int // layer id -> caches naming it
}

func newStoreSize(infos []CacheInfo) *storeSize {
	s := &storeSize{users: map[string]int{}}
	for _, c := range infos {
		for _, l := range c.Layers {
			if s.users[l.ID]++; s.users[l.ID] == 1 {
				s.total += l.Bytes
			}
		}
	}
	return s
}

// remove takes a removed cache's layers out of the count.
func (s *storeSize) remove(c CacheInfo) {
	for _, l := range c.Layers {
		if s.users[l.ID]--; s.users[l.ID] == 0 {
			s.total -= l.Bytes
		}
	}
}

func (o GCOptions) validate() error {
	if o.MaxAge < 0 || o.MaxBytes < 0 || o.MinFreeBytes < 0 {
		return fmt.Errorf("gc bounds must not be negative (max age %s, max bytes %d, min free bytes %d); use 0 to disable a bound", o.MaxAge, o.MaxBytes, o.MinFreeBytes)
	}
	if o.MinFreePercent < 0 || o.MinFreePercent >= 100 {
		return fmt.Errorf("gc min free percent %v is out of range: use a value from 0 (disabled) to below 100", o.MinFreePercent)
	}
	return nil
}

// lowOnSpace tells whether the filesystem of path has less free space (for
// root: statfs f_bavail) than opts ask for.
func (s *Store) lowOnSpace(opts GCOptions, path string) (bool, error) {
	if opts.MinFreeBytes == 0 && opts.MinFreePercent == 0 {
		return false, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("measure free space of %s: %w", path, err)
	}
	free := float64(st.Bavail) * float64(st.Bsize)
	size := float64(st.Blocks) * float64(st.Bsize)
	return (opts.MinFreeBytes > 0 && free < float64(opts.MinFreeBytes)) ||
		(opts.MinFreePercent > 0 && free < size*opts.MinFreePercent/100), nil
}

type sweepResult struct {
	RemovedLayers int
	FreedBytes    int64
}

// sweepLayers sweeps every layout (volumeLayout.sweep). One that cannot
// delete something never keeps the others from deleting theirs.
func (s *Store) sweepLayers(ctx context.Context) (sweepResult, error) {
	var res sweepResult
	var errs []error
	for _, l := range s.layouts() {
		swept, err := l.sweep(ctx)
		res.RemovedLayers += swept.RemovedLayers
		res.FreedBytes += swept.FreedBytes
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

func (s *Store) moveUnreferenced(ctx context.Context) ([]string, error) {
	l, err := s.lockStore(ctx, true)
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	refs, err := s.referencedLayers()
	if err != nil {
		return nil, err
	}
	var trash []string
	for _, dir := range []string{s.layersDir(), s.images().Images} {
		moved, err := s.moveAside(dir, refs)
		trash = append(trash, moved...)
		if err != nil {
			return trash, err
		}
	}
	// Last: a partial layer's mount went with layers/ above.
	moved, err := s.dropPartials(refs)
	return append(trash, moved...), err
}

// onDisk is what path (a layer directory or image) takes on disk.
func onDisk(path string) int64 {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		return st.Blocks * 512
	}
	bytes, _, _ := tree.DiskUsage(path)
	return bytes
}

// moveAside moves the entries of dir (layers/ or images/) that refs lacks
// into tmp/, unmounting an image layer's mount first: a mount point
// cannot be renamed, and nothing uses an unreferenced layer.
func (s *Store) moveAside(dir string, refs map[string]bool) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var trash []string
	for _, e := range entries {
		if refs[e.Name()] {
			continue
		}
		src := filepath.Join(dir, e.Name())
		served := dir == s.layersDir() && s.lazilyMounted(src, e.Name())
		if err := ondisk.Unmount(src); err != nil {
			return trash, fmt.Errorf("unmount unreferenced layer %s: %w", e.Name(), err)
		}
		if served {
			s.stopServing(e.Name())
		}
		dst := filepath.Join(s.tmpDir(), "trash-"+filepath.Base(dir)+"-"+e.Name())
		ondisk.FaultPoint()
		if err := os.Rename(src, dst); errors.Is(err, os.ErrNotExist) {
			continue // removed meanwhile (a discard's own sweep of its upper layer): what the move was for
		} else if err != nil {
			return trash, fmt.Errorf("move unreferenced layer %s aside: %w", e.Name(), err)
		}
		trash = append(trash, dst)
	}
	return trash, nil
}

// referencedLayers is every layer a head or a volume (its lower and upper
// directories) names: a layer exists iff something names it. Callers hold the store lock exclusively.
func (s *Store) referencedLayers() (map[string]bool, error) {
	refs := map[string]bool{}
	heads, err := s.heads()
	if err != nil {
		return nil, err
	}
	for _, h := range heads {
		for _, l := range h.Layers {
			refs[l.ID] = true
		}
	}
	recs, err := s.volumeRecords()
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		for _, id := range r.Layers {
			refs[id] = true
		}
		refs[r.Upper] = true // the volume's own layer
	}
	return refs, nil
}
