// Package kittest holds FakeStore, the store the agent's tests decide
// over: it keeps the store contract where the agent looks
// (layerfs/storetest runs against it in this package's tests), so that
// what those tests prove holds for the real store. Its volumes have no
// files: a build's writes are what it records of them.
package kittest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/layercache/layercache/layerfs"
)

// FakeStore stands in for layerfs.Store in tests of the agent's
// decisions. Tests read and set its fields; the agent calls its methods.
type FakeStore struct {
	mu         sync.Mutex
	VolumeByID map[string]*layerfs.Volume
	CacheByRef map[layerfs.CacheRef]*layerfs.CacheInfo
	MountOpts  map[string]layerfs.MountOptions
	Mounts     int
	Commits    []string
	Discards   []string
	Removed    []layerfs.CacheRef
	Squashed   []layerfs.CacheRef
	CommitErr  error
	GCRemoves  []layerfs.CacheRef
	MaxLayers  int
	// control holds the control files each volume's build wrote.
	Control map[string][]string
	// torn volumes were mounted when the node went down.
	Torn map[string]bool
	// written is how many bytes each volume's build wrote; a new volume
	// starts with buildWrites: the agent's tests assume builds write
	// unless they say otherwise, the store contract starts from nothing.
	Written     map[string]int64
	buildWrites int64
	// Lazy is what LazyStats reports; Resumes counts ResumeLazy's calls.
	Lazy    layerfs.LazyStats
	Resumes int
}

func NewFakeStore() *FakeStore {
	return &FakeStore{
		VolumeByID: map[string]*layerfs.Volume{},
		CacheByRef: map[layerfs.CacheRef]*layerfs.CacheInfo{},
		MountOpts:  map[string]layerfs.MountOptions{},
		MaxLayers:  2,
		Control:    map[string][]string{},
		Torn:       map[string]bool{},
		Written:    map[string]int64{},
		// buildWrites: the 100 bytes every fake commit reports.
		buildWrites: 100,
	}
}

func layerIDs(layers []layerfs.LayerInfo) []string {
	ids := make([]string, len(layers))
	for i, l := range layers {
		ids[i] = l.ID
	}
	return ids
}

func without(ids []string, id string) []string {
	var out []string
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

var errFakeStoreSync = errors.New("fakeStore keeps no layer data; sync tests use a real store")

func (s *FakeStore) Cache(ref layerfs.CacheRef) *layerfs.CacheInfo {
	c, ok := s.CacheByRef[ref]
	if !ok {
		c = &layerfs.CacheInfo{Cache: ref}
		s.CacheByRef[ref] = c
	}
	return c
}

func (s *FakeStore) Mount(_ context.Context, id string, opts layerfs.MountOptions) (*layerfs.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Mounts++
	if v, ok := s.VolumeByID[id]; ok {
		if v.Cache != opts.Cache {
			return nil, fmt.Errorf("volume %q belongs to cache %s, not %s", id, v.Cache, opts.Cache)
		}
		v.Mounted = true
		c := *v
		return &c, nil
	}
	v := &layerfs.Volume{
		ID: id, Cache: opts.Cache, ReadOnly: opts.ReadOnly, Writer: opts.Writer, Labels: opts.Labels,
		MergedPath: "/fake/volumes/" + id + "/merged", Mounted: true,
	}
	s.VolumeByID[id] = v
	s.MountOpts[id] = opts
	if _, ok := s.Written[id]; !ok {
		s.Written[id] = s.buildWrites
	}
	if seed := s.seedFor(opts); seed != nil {
		// As the store: a seeded volume leaves its cache alone until
		// its commit creates it.
		v.SeededFrom = &layerfs.Seed{Cache: seed.Cache, Generation: seed.Generation}
		v.Layers = layerIDs(seed.Layers)
		out := *v
		return &out, nil
	}
	c := s.Cache(opts.Cache)
	c.LastUsed = time.Now()
	v.BaseGeneration = c.Generation
	c.Volumes = append(c.Volumes, id)
	out := *v
	return &out, nil
}

// seedFor is the first of opts' fallbacks with a generation, if the cache
// has none (layerfs.MountOptions.Fallbacks).
func (s *FakeStore) seedFor(opts layerfs.MountOptions) *layerfs.CacheInfo {
	if c, ok := s.CacheByRef[opts.Cache]; ok && c.Generation > 0 {
		return nil
	}
	for _, f := range opts.Fallbacks {
		if c, ok := s.CacheByRef[f]; ok && f != opts.Cache && c.Generation > 0 {
			return c
		}
	}
	return nil
}

func (s *FakeStore) Commit(_ context.Context, id string) (layerfs.CommitResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commit(id)
}

// commit is Commit under s.mu.
func (s *FakeStore) commit(id string) (layerfs.CommitResult, error) {
	v, ok := s.VolumeByID[id]
	if !ok {
		return layerfs.CommitResult{}, fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	if v.ReadOnly {
		return layerfs.CommitResult{}, errors.New("read-only volume")
	}
	if s.CommitErr != nil {
		return layerfs.CommitResult{}, s.CommitErr
	}
	if limit := s.MountOpts[id].LimitBytes; limit > 0 && s.Written[id] > limit {
		delete(s.VolumeByID, id)
		s.Discards = append(s.Discards, id)
		return layerfs.CommitResult{Cache: v.Cache, OverLimit: true, Bytes: s.Written[id], Generation: s.Cache(v.Cache).Generation}, nil
	}
	if s.Torn[id] {
		delete(s.VolumeByID, id)
		s.Discards = append(s.Discards, id)
		return layerfs.CommitResult{Cache: v.Cache, Torn: true, Generation: s.Cache(v.Cache).Generation}, nil
	}
	s.Commits = append(s.Commits, id)
	delete(s.VolumeByID, id)
	var seeded *layerfs.Seed
	c, ok := s.CacheByRef[v.Cache]
	switch {
	case v.SeededFrom != nil && s.Written[id] == 0:
		return layerfs.CommitResult{Cache: v.Cache}, nil // creates nothing
	case v.SeededFrom != nil && (!ok || c.Generation == 0):
		// Created on the fallback's layers as they were at the mount.
		c = s.Cache(v.Cache)
		for _, l := range v.Layers {
			c.Layers = append(c.Layers, layerfs.LayerInfo{ID: l, Bytes: 100})
			c.Bytes += 100
		}
		seeded, c.SeededFrom = v.SeededFrom, v.SeededFrom
	case !ok:
		return layerfs.CommitResult{Cache: v.Cache, Dropped: true}, nil
	}
	c.Volumes = without(c.Volumes, id)
	if s.Written[id] == 0 {
		return layerfs.CommitResult{Cache: v.Cache, Generation: c.Generation}, nil
	}
	c.Generation++
	c.Layers = append([]layerfs.LayerInfo{{ID: fmt.Sprintf("l%d", c.Generation), Bytes: 100}}, c.Layers...)
	c.Bytes += 100
	c.LastWriter = v.Writer
	return layerfs.CommitResult{Cache: v.Cache, Generation: c.Generation, Layer: c.Layers[0].ID, Bytes: 100, NeedsSquash: len(c.Layers) > s.MaxLayers, SeededFrom: seeded}, nil
}

func (s *FakeStore) Discard(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.discard(id)
}

// discard is Discard under s.mu.
func (s *FakeStore) discard(id string) error {
	v, ok := s.VolumeByID[id]
	if !ok {
		return fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	s.Discards = append(s.Discards, id)
	delete(s.VolumeByID, id)
	if c, ok := s.CacheByRef[v.Cache]; ok {
		c.Volumes = without(c.Volumes, id)
	}
	return nil
}

// End ends a volume as layerfs.Store.End does: the control files its
// build wrote are Control's, its changes its writes. Decide and
// BeforeSeal run under s.mu, as the store's run under the volume's lock:
// a BeforeSeal that calls the store, which the store forbids, deadlocks.
func (s *FakeStore) End(_ context.Context, id string, opts layerfs.EndOptions) (layerfs.EndResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.VolumeByID[id]
	if !ok {
		return layerfs.EndResult{}, fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	res := layerfs.EndResult{Written: map[string]bool{}}
	for _, name := range opts.ControlFiles {
		res.Written[name] = slices.Contains(s.Control[id], name)
	}
	res.Kept = !v.ReadOnly && (opts.Decide == nil || opts.Decide(res.Written))
	if !res.Kept {
		return res, s.discard(id)
	}
	if res.Announced = opts.BeforeSeal != nil && s.Written[id] > 0; res.Announced {
		opts.BeforeSeal()
	}
	var err error
	res.Commit, err = s.commit(id)
	return res, err
}

func (s *FakeStore) Volume(_ context.Context, id string) (*layerfs.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.VolumeByID[id]
	if !ok {
		return nil, fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	c := *v
	return &c, nil
}

func (s *FakeStore) Volumes(context.Context) ([]layerfs.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var vols []layerfs.Volume
	for _, v := range s.VolumeByID {
		vols = append(vols, *v)
	}
	return vols, nil
}

func (s *FakeStore) Squash(_ context.Context, ref layerfs.CacheRef, maxLayers int) (layerfs.SquashResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Squashed = append(s.Squashed, ref)
	c, ok := s.CacheByRef[ref]
	if !ok || len(c.Layers) <= maxLayers {
		return layerfs.SquashResult{}, nil
	}
	res := layerfs.SquashResult{Squashed: true, Layer: c.Layers[0].ID + "-squashed", OldLayers: len(c.Layers)}
	c.Layers = []layerfs.LayerInfo{{ID: res.Layer, Bytes: c.Bytes}}
	return res, nil
}

func (s *FakeStore) GC(_ context.Context, _ layerfs.GCOptions) (layerfs.GCResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ref := range s.GCRemoves {
		delete(s.CacheByRef, ref)
	}
	return layerfs.GCResult{RemovedCaches: s.GCRemoves}, nil
}

func (s *FakeStore) Remove(_ context.Context, ref layerfs.CacheRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.CacheByRef[ref]; !ok {
		return fmt.Errorf("cache %s: %w", ref, layerfs.ErrNotFound)
	}
	delete(s.CacheByRef, ref)
	s.Removed = append(s.Removed, ref)
	return nil
}

// RemoveIfUnused keeps caches a writable volume uses, as the store does.
func (s *FakeStore) RemoveIfUnused(ctx context.Context, ref layerfs.CacheRef) (bool, error) {
	s.mu.Lock()
	c, ok := s.CacheByRef[ref]
	if !ok {
		s.mu.Unlock()
		return false, nil
	}
	for _, id := range c.Volumes {
		if v := s.VolumeByID[id]; v != nil && !v.ReadOnly {
			s.mu.Unlock()
			return false, nil
		}
	}
	s.mu.Unlock()
	return true, s.Remove(ctx, ref)
}

func (s *FakeStore) List(_ context.Context) ([]layerfs.CacheInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []layerfs.CacheInfo
	for _, c := range s.CacheByRef {
		out = append(out, *c)
	}
	return out, nil
}

func (s *FakeStore) Inspect(_ context.Context, ref layerfs.CacheRef) (layerfs.CacheInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.CacheByRef[ref]
	if !ok {
		return layerfs.CacheInfo{}, fmt.Errorf("cache %s: %w", ref, layerfs.ErrNotFound)
	}
	return *c, nil
}

func (s *FakeStore) Recover(context.Context) (layerfs.RecoverResult, error) {
	return layerfs.RecoverResult{}, nil
}

func (s *FakeStore) Committed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.Commits...)
}

func (s *FakeStore) MountCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Mounts
}

func (s *FakeStore) ExportLayer(context.Context, layerfs.CacheRef, string, io.Writer) error {
	return errFakeStoreSync
}

func (s *FakeStore) SetLayerDigest(context.Context, layerfs.CacheRef, string, string) error {
	return errFakeStoreSync
}

func (s *FakeStore) Sync(context.Context, layerfs.CacheRef, layerfs.Chain, layerfs.Fetch, layerfs.SyncOptions) (layerfs.SyncResult, error) {
	return layerfs.SyncResult{}, errFakeStoreSync
}

// ResumeLazy counts its calls: the fake store mounts nothing lazily.
func (s *FakeStore) ResumeLazy(context.Context, layerfs.OpenLazy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Resumes++
	return nil
}

func (s *FakeStore) LazyStats() layerfs.LazyStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Lazy
}
