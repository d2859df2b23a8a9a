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
)

// Remove deletes a cache. Volumes that use it keep their layers until they
// end; their commits are dropped, as the removal asked.
func (s *Store) Remove(ctx context.Context, cache CacheRef) error {
	if err := cache.Validate(); err != nil {
		return err
	}
	if err := s.removeCache(ctx, cache); err != nil {
		return err
	}
	_, err := s.sweepLayers(ctx)
	return err
}

func (s *Store) removeCache(ctx context.Context, cache CacheRef) error {
	return s.withCache(ctx, cache, func(*head) (bool, error) {
		return s.removeCacheFiles(cache)
	})
}

// withCache runs fn on the cache's head under the cache's lock, which is
// released on every path; its file goes with the cache when fn says the
// cache is gone, or when there is no such cache.
func (s *Store) withCache(ctx context.Context, cache CacheRef, fn func(h *head) (gone bool, err error)) error {
	l, err := s.lockCache(ctx, cache)
	if err != nil {
		return err
	}
	h, err := s.readHead(cache)
	if err != nil {
		releaseOnError(l, err)
		return fmt.Errorf("cache %s: %w", cache, err)
	}
	gone, err := fn(h)
	if gone {
		l.removeAndUnlock()
	} else {
		l.unlock()
	}
	return err
}

// removeCacheFiles removes a cache whose lock the caller holds.
func (s *Store) removeCacheFiles(cache CacheRef) (gone bool, err error) {
	// Removing head.json is the commit point: from here the cache is gone.
	if err := os.Remove(s.headPath(cache)); err != nil {
		return false, fmt.Errorf("remove cache %s: %w", cache, err)
	}
	syncDir(s.cacheDir(cache))
	os.RemoveAll(s.cacheDir(cache))
	os.Remove(filepath.Dir(s.cacheDir(cache))) // the namespace dir, if now empty
	return true, nil
}

// RemoveIfUnused removes a cache unless a writable volume uses it (see
// cacheInUse), deciding under
// the cache's lock: Mount holds that lock until its volume is recorded, so
// no volume can start using the cache between the check and the removal
// (which would drop its commit). removed is false for a cache in use or
// one that does not exist. This is what retention policies should call;
// Remove is for an operator who wants the cache gone even while in use.
func (s *Store) RemoveIfUnused(ctx context.Context, cache CacheRef) (removed bool, err error) {
	if err := cache.Validate(); err != nil {
		return false, err
	}
	removed, err = s.removeIfUnused(ctx, cache, time.Time{})
	if err != nil || !removed {
		return removed, err
	}
	_, err = s.sweepLayers(ctx)
	return true, err
}

// removeIfUnused removes the cache if no volume of its current incarnation
// exists and, unless lastUsed is zero, it was not used since lastUsed (a
// GC decision made from an earlier List stays true).
func (s *Store) removeIfUnused(ctx context.Context, cache CacheRef, lastUsed time.Time) (removed bool, err error) {
	err = s.withCache(ctx, cache, func(h *head) (bool, error) {
		if !lastUsed.IsZero() && !h.LastUsed.Equal(lastUsed) {
			return false, nil
		}
		if inUse, err := s.cacheInUse(h); err != nil || inUse {
			return false, err
		}
		removed, err = s.removeCacheFiles(cache)
		return removed, err
	})
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return removed, err
}

// cacheInUse tells whether a writable volume of this incarnation of the
// cache exists: its commit would be dropped. A read-only view never
// commits, and the layers it mounts stay until it ends, so it holds no
// cache: a reader (another namespace's build, whose grant may since have
// been revoked) cannot keep the owner's retention or GC from running.
// Callers hold the cache lock.
func (s *Store) cacheInUse(h *head) (bool, error) {
	recs, err := s.volumeRecords()
	if err != nil {
		return false, err
	}
	for _, r := range recs {
		if r.Cache == h.Cache && r.CacheUID == h.UID && !r.ReadOnly {
			return true, nil
		}
	}
	return false, nil
}

// heads reads every cache's head.
func (s *Store) heads() ([]*head, error) {
	namespaces, err := os.ReadDir(s.cachesDir())
	if err != nil {
		return nil, err
	}
	var heads []*head
	for _, ns := range namespaces {
		names, err := os.ReadDir(filepath.Join(s.cachesDir(), ns.Name()))
		if err != nil {
			continue // removed meanwhile
		}
		for _, n := range names {
			ref := CacheRef{Namespace: ns.Name(), Name: n.Name()}
			if ref.Validate() != nil {
				continue
			}
			h, err := s.readHead(ref)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			heads = append(heads, h)
		}
	}
	return heads, nil
}

// List reports every cache, sorted by name.
func (s *Store) List(ctx context.Context) ([]CacheInfo, error) {
	heads, err := s.heads()
	if err != nil {
		return nil, err
	}
	users, err := s.volumesByCache()
	if err != nil {
		return nil, err
	}
	infos := make([]CacheInfo, len(heads))
	for i, h := range heads {
		infos[i] = cacheInfo(h, users[h.Cache])
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Cache.String() < infos[j].Cache.String() })
	return infos, nil
}

// Inspect reports one cache.
func (s *Store) Inspect(ctx context.Context, cache CacheRef) (CacheInfo, error) {
	if err := cache.Validate(); err != nil {
		return CacheInfo{}, err
	}
	h, err := s.readHead(cache)
	if err != nil {
		return CacheInfo{}, fmt.Errorf("cache %s: %w", cache, err)
	}
	users, err := s.volumesByCache()
	if err != nil {
		return CacheInfo{}, err
	}
	return cacheInfo(h, users[cache]), nil
}

func cacheInfo(h *head, volumes []string) CacheInfo {
	return CacheInfo{
		Cache: h.Cache, Generation: h.Generation, Layers: h.Layers, Bytes: h.bytes(),
		LastUsed: h.LastUsed, LastWriter: h.LastWriter, Volumes: volumes,
	}
}

func (s *Store) volumesByCache() (map[CacheRef][]string, error) {
	recs, err := s.volumeRecords()
	if err != nil {
		return nil, err
	}
	users := map[CacheRef][]string{}
	for _, r := range recs {
		users[r.Cache] = append(users[r.Cache], r.ID)
	}
	return users, nil
}

// GC removes caches unused for longer than opts.MaxAge, then the least
// recently used caches while the store holds more than opts.MaxBytes or
// its filesystem has less free space than opts.MinFreeBytes or
// opts.MinFreePercent, then every layer no cache or volume references.
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
	var total int64
	for _, c := range infos {
		total += c.Bytes
	}
	now := time.Now()
	for i, c := range infos {
		expired := opts.MaxAge > 0 && now.Sub(c.LastUsed) > opts.MaxAge
		over := opts.MaxBytes > 0 && total > opts.MaxBytes
		low, err := s.lowOnSpace(opts)
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
		total -= c.Bytes
		res.RemovedCaches = append(res.RemovedCaches, c.Cache)
		s.progress(Progress{Op: "gc", Cache: c.Cache.String(), Done: int64(i + 1), Total: int64(len(infos))})
		if low {
			// Free space is measured, so the layers must go before the
			// next measurement.
			swept, err := s.sweepLayers(ctx)
			res.RemovedLayers += swept.RemovedLayers
			res.FreedBytes += swept.FreedBytes
			if err != nil {
				return res, err
			}
		}
	}
	swept, err := s.sweepLayers(ctx)
	res.RemovedLayers += swept.RemovedLayers
	res.FreedBytes += swept.FreedBytes
	s.refillReserve()
	return res, err
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

// lowOnSpace tells whether the store's filesystem has less free space (for
// root: statfs f_bavail) than opts ask for.
func (s *Store) lowOnSpace(opts GCOptions) (bool, error) {
	if opts.MinFreeBytes == 0 && opts.MinFreePercent == 0 {
		return false, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.root, &st); err != nil {
		return false, fmt.Errorf("measure free space of %s: %w", s.root, err)
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

// sweepLayers removes every directory under layers/ that no head and no
// volume references, including temp dirs of crashed builds. It holds the
// store lock exclusively only while it moves them aside; deleting their
// contents happens after.
func (s *Store) sweepLayers(ctx context.Context) (sweepResult, error) {
	var res sweepResult
	trash, err := s.moveUnreferenced(ctx)
	if err != nil {
		return res, err
	}
	for i, dir := range trash {
		bytes := onDisk(dir)
		if err := os.RemoveAll(dir); err != nil {
			return res, fmt.Errorf("remove unreferenced layer: %w", err)
		}
		res.RemovedLayers++
		res.FreedBytes += bytes
		s.progress(Progress{Op: "gc", Done: int64(i + 1), Total: int64(len(trash))})
	}
	return res, nil
}

func (s *Store) moveUnreferenced(ctx context.Context) ([]string, error) {
	l, err := s.lockStore(ctx, true)
	if err != nil {
		return nil, err
	}
	defer l.unlock()
	refs, err := s.referencedLayers()
	if err != nil {
		return nil, err
	}
	var trash []string
	for _, dir := range []string{s.layersDir(), s.imagesDir()} {
		moved, err := s.moveAside(dir, refs)
		trash = append(trash, moved...)
		if err != nil {
			return trash, err
		}
	}
	return trash, nil
}

// onDisk is what path (a layer directory or image) takes on disk.
func onDisk(path string) int64 {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		return st.Blocks * 512
	}
	bytes, _, _ := diskUsage(path)
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
		if err := unmount(src); err != nil {
			return trash, fmt.Errorf("unmount unreferenced layer %s: %w", e.Name(), err)
		}
		dst := filepath.Join(s.tmpDir(), "trash-"+filepath.Base(dir)+"-"+e.Name())
		faultPoint()
		if err := os.Rename(src, dst); err != nil {
			return trash, fmt.Errorf("move unreferenced layer %s aside: %w", e.Name(), err)
		}
		trash = append(trash, dst)
	}
	return trash, nil
}

// referencedLayers is every layer a head, a volume's lower dirs or a
// pending commit refers to. Callers hold the store lock exclusively.
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
		if r.CommitLayer != nil {
			refs[r.CommitLayer.ID] = true
		}
	}
	return refs, nil
}
