package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
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
	l, err := s.lockCache(ctx, cache)
	if err != nil {
		return err
	}
	if _, err := s.readHead(cache); err != nil {
		releaseOnError(l, err)
		return fmt.Errorf("cache %s: %w", cache, err)
	}
	// Removing head.json is the commit point: from here the cache is gone.
	if err := os.Remove(s.headPath(cache)); err != nil {
		l.unlock()
		return fmt.Errorf("remove cache %s: %w", cache, err)
	}
	syncDir(s.cacheDir(cache))
	os.RemoveAll(s.cacheDir(cache))
	os.Remove(filepath.Dir(s.cacheDir(cache))) // the namespace dir, if now empty
	l.removeAndUnlock()
	return nil
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
// recently used caches while the store holds more than opts.MaxBytes, then
// every layer no cache or volume references. Caches in use are kept.
func (s *Store) GC(ctx context.Context, opts GCOptions) (GCResult, error) {
	var res GCResult
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
		if len(c.Volumes) > 0 || !(expired || over) {
			continue
		}
		if err := s.removeCache(ctx, c.Cache); err != nil && !errors.Is(err, ErrNotFound) {
			return res, err
		}
		total -= c.Bytes
		res.RemovedCaches = append(res.RemovedCaches, c.Cache)
		s.progress(Progress{Op: "gc", Cache: c.Cache.String(), Done: int64(i + 1), Total: int64(len(infos))})
	}
	swept, err := s.sweepLayers(ctx)
	res.RemovedLayers, res.FreedBytes = swept.RemovedLayers, swept.FreedBytes
	return res, err
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
		bytes, _, _ := diskUsage(dir)
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
	entries, err := os.ReadDir(s.layersDir())
	if err != nil {
		return nil, err
	}
	var trash []string
	for _, e := range entries {
		if refs[e.Name()] {
			continue
		}
		dst := filepath.Join(s.tmpDir(), "trash-"+e.Name())
		faultPoint()
		if err := os.Rename(s.layerDir(e.Name()), dst); err != nil {
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
