package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
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
	return s.transact(ctx, scope{cache: cache}, func(t *txn) error {
		if t.Head == nil {
			return fmt.Errorf("cache %s: %w", cache, ErrNotFound)
		}
		t.Head = nil
		return nil
	})
}

// removeCacheFiles removes a cache whose lock the caller holds.
func (s *Store) removeCacheFiles(cache CacheRef) error {
	// Removing head.json is the commit point: from here the cache is gone.
	if err := os.Remove(s.headPath(cache)); err != nil {
		return fmt.Errorf("remove cache %s: %w", cache, err)
	}
	ondisk.SyncDir(s.cacheDir(cache))
	os.RemoveAll(s.cacheDir(cache))
	os.Remove(filepath.Dir(s.cacheDir(cache))) // the namespace dir, if now empty
	return nil
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
	err = s.transact(ctx, scope{cache: cache}, func(t *txn) error {
		if t.Head == nil || (!lastUsed.IsZero() && !t.Head.LastUsed.Equal(lastUsed)) {
			return nil
		}
		if inUse, err := s.cacheInUse(t.Head); err != nil || inUse {
			return err
		}
		t.Head, removed = nil, true
		return nil
	})
	return removed && err == nil, err
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
		infos[i] = s.cacheInfo(h, users[h.Cache])
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
	return s.cacheInfo(h, users[cache]), nil
}

func (s *Store) cacheInfo(h *head, volumes []string) CacheInfo {
	info := CacheInfo{
		Cache: h.Cache, Generation: h.Generation, Layers: h.Layers, Bytes: h.bytes(),
		LastUsed: h.LastUsed, LastWriter: h.LastWriter, Volumes: volumes,
		Layout: h.Layout.orDefault(), SeededFrom: h.SeededFrom,
	}
	for _, l := range h.Layers {
		if l.Digest != "" && s.isPartial(l.ID) {
			info.Filling++
		}
	}
	return info
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
