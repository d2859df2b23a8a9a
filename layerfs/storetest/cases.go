package storetest

import (
	"testing"

	"github.com/layercache/layercache/layerfs"
)

type testCase struct {
	name string
	run  func(t *testing.T, r *run)
}

var cases = []testCase{
	{"mount is idempotent and keeps its cache", func(t *testing.T, r *run) {
		v := r.mount(t, "v", layerfs.MountOptions{})
		if v.ID != "v" || v.Cache != cacheC || !v.Mounted {
			t.Fatalf("Mount = %+v, want volume v of %s, mounted", v, cacheC)
		}
		if again := r.mount(t, "v", layerfs.MountOptions{}); again.ID != v.ID || again.MergedPath != v.MergedPath {
			t.Errorf("second Mount = %+v, want %+v", again, v)
		}
		other := layerfs.CacheRef{Namespace: "ns", Name: "other"}
		if _, err := r.s.Mount(r.ctx, "v", layerfs.MountOptions{Cache: other}); err == nil {
			t.Error("Mount of an existing volume for another cache succeeded")
		}
	}},
	{"commit lands the changes and ends the volume", func(t *testing.T, r *run) {
		res := r.build(t, "v", map[string]string{"f": "1"})
		if res.Layer == "" || res.Generation != 1 || res.Cache != cacheC {
			t.Fatalf("Commit = %+v, want a layer at generation 1", res)
		}
		if r.layers(t) != 1 {
			t.Errorf("cache has %d layers, want 1", r.layers(t))
		}
		_, err := r.s.Volume(r.ctx, "v")
		expectNotFound(t, "Volume after commit", err)
		r.expectShows(t, map[string]string{"f": "1"})
	}},
	{"commits stack and later ones shadow", func(t *testing.T, r *run) {
		r.build(t, "a", map[string]string{"f": "1", "g": "1"})
		if res := r.build(t, "b", map[string]string{"f": "2"}); res.Generation != 2 {
			t.Errorf("second Commit = %+v, want generation 2", res)
		}
		r.expectShows(t, map[string]string{"f": "2", "g": "1"})
	}},
	{"a commit without changes adds no layer", func(t *testing.T, r *run) {
		r.build(t, "a", map[string]string{"f": "1"})
		if res := r.build(t, "b", nil); res.Layer != "" || res.Generation != 1 {
			t.Errorf("empty Commit = %+v, want no layer, generation 1", res)
		}
	}},
	{"discard loses the changes", func(t *testing.T, r *run) {
		v := r.mount(t, "v", layerfs.MountOptions{})
		r.h.Write(t, v, "f", "1")
		if err := r.s.Discard(r.ctx, "v"); err != nil {
			t.Fatal(err)
		}
		_, err := r.s.Volume(r.ctx, "v")
		expectNotFound(t, "Volume after discard", err)
		if r.layers(t) != 0 {
			t.Errorf("cache has %d layers after a discard, want 0", r.layers(t))
		}
		r.expectShows(t, nil, "f")
	}},
	{"control files never land", func(t *testing.T, r *run) {
		v := r.mount(t, "v", layerfs.MountOptions{})
		r.h.Write(t, v, controlCommit, "")
		r.h.Write(t, v, "f", "1")
		r.commit(t, "v")
		r.expectShows(t, map[string]string{"f": "1"}, controlCommit)
		r.mount(t, "w", layerfs.MountOptions{})
		if res := r.end(t, "w", nil); res.Written[commitMarker] || res.Written["other"] {
			t.Errorf("End of a new volume of the cache = %+v, want no control file written", res)
		}
	}},
	{"a read-only volume cannot be committed", func(t *testing.T, r *run) {
		r.mount(t, "v", layerfs.MountOptions{ReadOnly: true})
		if _, err := r.s.Commit(r.ctx, "v"); err == nil {
			t.Error("Commit of a read-only volume succeeded")
		}
		if err := r.s.Discard(r.ctx, "v"); err != nil {
			t.Errorf("Discard of a read-only volume: %v", err)
		}
	}},
	{"unknown volumes are not found", func(t *testing.T, r *run) {
		_, err := r.s.Commit(r.ctx, "nope")
		expectNotFound(t, "Commit", err)
		expectNotFound(t, "Discard", r.s.Discard(r.ctx, "nope"))
		_, err = r.s.Volume(r.ctx, "nope")
		expectNotFound(t, "Volume", err)
		_, err = r.s.End(r.ctx, "nope", layerfs.EndOptions{ControlFiles: endControlFiles})
		expectNotFound(t, "End", err)
	}},
	{squashCase, func(t *testing.T, r *run) {
		r.build(t, "a", map[string]string{"f": "1", "g": "1"})
		r.build(t, "b", map[string]string{"f": "2"})
		r.build(t, "c", map[string]string{"h": "3"})
		res, err := r.s.Squash(r.ctx, cacheC, 1)
		if err != nil || !res.Squashed || res.OldLayers != 3 {
			t.Fatalf("Squash = %+v, %v; want 3 layers squashed", res, err)
		}
		if r.layers(t) != 1 {
			t.Errorf("cache has %d layers after squash, want 1", r.layers(t))
		}
		r.expectShows(t, map[string]string{"f": "2", "g": "1", "h": "3"})
	}},
	{"removal drops the commits of volumes in use", func(t *testing.T, r *run) {
		r.build(t, "a", map[string]string{"f": "1"})
		v := r.mount(t, "v", layerfs.MountOptions{})
		if removed, err := r.s.RemoveIfUnused(r.ctx, cacheC); err != nil || removed {
			t.Errorf("RemoveIfUnused of a cache in use = %v, %v; want kept", removed, err)
		}
		if err := r.s.Remove(r.ctx, cacheC); err != nil {
			t.Fatal(err)
		}
		_, err := r.s.Inspect(r.ctx, cacheC)
		expectNotFound(t, "Inspect after Remove", err)
		r.h.Write(t, v, "g", "2")
		if res := r.commit(t, "v"); !res.Dropped {
			t.Errorf("Commit after the cache's removal = %+v, want dropped", res)
		}
	}},
	{"remove-if-unused removes an unused cache", func(t *testing.T, r *run) {
		r.build(t, "a", map[string]string{"f": "1"})
		if removed, err := r.s.RemoveIfUnused(r.ctx, cacheC); err != nil || !removed {
			t.Errorf("RemoveIfUnused = %v, %v; want removed", removed, err)
		}
	}},
}

// squashCase is the name of the case that needs a layered store.
const squashCase = "squash keeps what the cache shows"

// syncCases need a store that keeps layer data (see Harness.NoSync).
var syncCases = []testCase{
	{"sync keeps unpublished layers on top", func(t *testing.T, r *run) {
		r.build(t, "a", map[string]string{"f": "1"})
		res, err := r.s.Sync(r.ctx, cacheC, layerfs.Chain{Generation: 1}, discardFetch, layerfs.SyncOptions{})
		if err != nil || res.Unpublished != 1 || res.Fetched != 0 {
			t.Fatalf("Sync of an empty chain = %+v, %v; want the one unpublished layer kept", res, err)
		}
		r.expectShows(t, map[string]string{"f": "1"})
	}},
}
