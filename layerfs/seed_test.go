package layerfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// mountSeeded mounts volume id of cache with fallbacks.
func mountSeeded(t testing.TB, s *Store, id, cache string, fallbacks ...string) *Volume {
	t.Helper()
	opts := MountOptions{Cache: mustRef(t, cache)}
	for _, f := range fallbacks {
		opts.Fallbacks = append(opts.Fallbacks, mustRef(t, f))
	}
	v, err := s.Mount(context.Background(), id, opts)
	if err != nil {
		t.Fatalf("Mount(%s, %s, fallbacks %v): %v", id, cache, fallbacks, err)
	}
	return v
}

// commitFile commits one file as a new layer of cache.
func commitFile(t testing.TB, s *Store, cache, name, content string) CommitResult {
	t.Helper()
	id := "build-" + randomID()
	writeFile(t, filepath.Join(mustMount(t, s, id, cache), name), content)
	return mustCommit(t, s, id)
}

func mustInspect(t testing.TB, s *Store, cache string) CacheInfo {
	t.Helper()
	info, err := s.Inspect(context.Background(), mustRef(t, cache))
	if err != nil {
		t.Fatalf("Inspect(%s): %v", cache, err)
	}
	return info
}

func assertNoCache(t testing.TB, s *Store, cache string) {
	t.Helper()
	if info, err := s.Inspect(context.Background(), mustRef(t, cache)); !errors.Is(err, ErrNotFound) {
		t.Errorf("Inspect(%s) = %+v, %v; want ErrNotFound (nothing created)", cache, info, err)
	}
}

func layerIDs(layers []LayerInfo) []string {
	ids := make([]string, len(layers))
	for i, l := range layers {
		ids[i] = l.ID
	}
	return ids
}

func TestSeedFromFallback(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	commitFile(t, s, "ns/main", "main.txt", "main 1")
	commitFile(t, s, "ns/main", "shared.txt", "main")
	main := mustInspect(t, s, "ns/main")
	mainView := view(t, s, "ns/main")

	// The first build of pr-1 starts from main, shared, not copied.
	v := mountSeeded(t, s, "pr-a", "ns/pr-1", "ns/main")
	if want := (Seed{Cache: mustRef(t, "ns/main"), Generation: 2}); v.SeededFrom == nil || *v.SeededFrom != want {
		t.Fatalf("Volume.SeededFrom = %v, want %v", v.SeededFrom, want)
	}
	if !slices.Equal(v.Layers, layerIDs(main.Layers)) || v.BaseGeneration != 0 {
		t.Fatalf("volume layers %v (base %d), want main's %v (base 0)", v.Layers, v.BaseGeneration, layerIDs(main.Layers))
	}
	if got := readFile(t, filepath.Join(v.MergedPath, "main.txt")); got != "main 1" {
		t.Fatalf("main.txt = %q in the seeded volume", got)
	}
	writeFile(t, filepath.Join(v.MergedPath, "pr.txt"), "pr 1")
	writeFile(t, filepath.Join(v.MergedPath, "shared.txt"), "pr")
	res := mustCommit(t, s, "pr-a")
	if res.Generation != 1 || res.Layer == "" || res.SeededFrom == nil || res.SeededFrom.Cache != mustRef(t, "ns/main") {
		t.Fatalf("seeded commit = %+v, want generation 1 seeded from ns/main", res)
	}
	pr := mustInspect(t, s, "ns/pr-1")
	if want := append([]string{res.Layer}, layerIDs(main.Layers)...); !slices.Equal(layerIDs(pr.Layers), want) {
		t.Fatalf("pr-1 layers = %v, want the new layer on main's: %v", layerIDs(pr.Layers), want)
	}
	if pr.SeededFrom == nil || pr.SeededFrom.Generation != 2 {
		t.Errorf("pr-1 SeededFrom = %v, want ns/main@2", pr.SeededFrom)
	}

	// main is unchanged.
	if got := mustInspect(t, s, "ns/main"); got.Generation != main.Generation || !slices.Equal(layerIDs(got.Layers), layerIDs(main.Layers)) {
		t.Errorf("main changed: %+v, was %+v", got, main)
	}
	if d := diffSnapshots(mainView, view(t, s, "ns/main")); d != "" {
		t.Errorf("main's view changed: %s", d)
	}

	// The next build of pr-1 sees main's files and the first PR build's;
	// main's later commits don't reach pr-1 (its fallbacks are ignored now).
	commitFile(t, s, "ns/main", "late.txt", "after pr-1 exists")
	v2 := mountSeeded(t, s, "pr-b", "ns/pr-1", "ns/main")
	if v2.SeededFrom != nil || v2.BaseGeneration != 1 {
		t.Fatalf("second pr-1 volume: SeededFrom %v, base %d; want nil, 1", v2.SeededFrom, v2.BaseGeneration)
	}
	for file, want := range map[string]string{"main.txt": "main 1", "pr.txt": "pr 1", "shared.txt": "pr"} {
		if got := readFile(t, filepath.Join(v2.MergedPath, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	assertMissing(t, filepath.Join(v2.MergedPath, "late.txt"))
	writeFile(t, filepath.Join(v2.MergedPath, "pr2.txt"), "pr 2")
	if res := mustCommit(t, s, "pr-b"); res.Generation != 2 || res.SeededFrom != nil {
		t.Errorf("second pr-1 commit = %+v, want generation 2, not seeded", res)
	}
	assertNoOrphans(t, s)
	if vols, err := s.Volumes(ctx); err != nil || len(vols) != 0 {
		t.Errorf("Volumes = %v, %v; want none", vols, err)
	}
}

func TestSeedPicksFirstFallbackWithAGeneration(t *testing.T) {
	s := newTestStore(t, Options{})
	commitFile(t, s, "ns/second", "f", "second")
	commitFile(t, s, "ns/third", "f", "third")
	commitFile(t, s, "other/main", "f", "other")
	// A cache with an empty head (a volume mounted, nothing committed)
	// has no generation.
	mustMount(t, s, "idle", "ns/empty")
	contents := map[string]string{"ns/second": "second", "ns/third": "third", "other/main": "other"}

	for _, tc := range []struct {
		name      string
		fallbacks []string
		want      string // "" for not seeded
	}{
		{"first wins", []string{"ns/second", "ns/third"}, "ns/second"},
		{"missing skipped", []string{"ns/missing", "ns/third", "ns/second"}, "ns/third"},
		{"empty head skipped", []string{"ns/empty", "ns/second"}, "ns/second"},
		{"itself skipped", []string{"ns/pr", "ns/third"}, "ns/third"},
		{"another namespace", []string{"other/main"}, "other/main"},
		{"none exists", []string{"ns/missing", "ns/empty"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "v-" + randomID()
			v := mountSeeded(t, s, id, "ns/pr", tc.fallbacks...)
			defer func() { must(t, s.Discard(context.Background(), id)) }()
			got := ""
			if v.SeededFrom != nil {
				got = v.SeededFrom.Cache.String()
				if f, want := readFile(t, filepath.Join(v.MergedPath, "f")), contents[got]; f != want {
					t.Errorf("f = %q, want %q (from %s)", f, want, got)
				}
			}
			if got != tc.want {
				t.Errorf("seeded from %q, want %q", got, tc.want)
			}
		})
	}
}

// Nothing but a commit with changes creates the seeded cache.
func TestSeededVolumeThatDoesNotCommitCreatesNothing(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		readOnly bool
		end      func(s *Store, id string) error
	}{
		{"discarded", false, func(s *Store, id string) error { return s.Discard(ctx, id) }},
		{"no changes", false, func(s *Store, id string) error {
			res, err := s.Commit(ctx, id)
			if err == nil && (res.Layer != "" || res.Generation != 0 || res.SeededFrom != nil || res.Dropped) {
				t.Errorf("commit without changes = %+v, want nothing", res)
			}
			return err
		}},
		{"over its limit", false, func(s *Store, id string) error {
			r, err := s.readVolume(id)
			must(t, err)
			r.LimitBytes = 1
			must(t, ondisk.WriteJSONAtomic(s.volumePath(id), r))
			res, err := s.Commit(ctx, id)
			if err == nil && !res.OverLimit {
				t.Errorf("commit = %+v, want over its limit", res)
			}
			return err
		}},
		{"read-only", true, func(s *Store, id string) error { return s.Discard(ctx, id) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, Options{})
			commitFile(t, s, "ns/main", "main.txt", "main")
			main := mustInspect(t, s, "ns/main")
			v, err := s.Mount(ctx, "pr", MountOptions{Cache: mustRef(t, "ns/pr-1"), ReadOnly: tc.readOnly, Fallbacks: []CacheRef{mustRef(t, "ns/main")}})
			must(t, err)
			if v.SeededFrom == nil || readFile(t, filepath.Join(v.MergedPath, "main.txt")) != "main" {
				t.Fatalf("volume not seeded: %+v", v)
			}
			if tc.name != "no changes" {
				writeFile(t, filepath.Join(v.MergedPath, "pr.txt"), "pr")
			}
			if tc.readOnly {
				if _, err := s.Commit(ctx, "pr"); err == nil {
					t.Fatal("a read-only volume committed")
				}
			}
			must(t, tc.end(s, "pr"))
			assertNoCache(t, s, "ns/pr-1")
			if got := mustInspect(t, s, "ns/main"); !slices.Equal(layerIDs(got.Layers), layerIDs(main.Layers)) {
				t.Errorf("main changed: %+v", got)
			}
			assertNoOrphans(t, s)
		})
	}
}

// Whoever commits first decides: a seeded volume whose cache got a
// generation meanwhile lands on it as any concurrent writer does, and an
// empty head a plain mount made is seeded by the first seeded commit.
func TestSeededCommitAfterTheCacheChanged(t *testing.T) {
	s := newTestStore(t, Options{})
	commitFile(t, s, "ns/main", "main.txt", "main")

	t.Run("another build committed first", func(t *testing.T) {
		v := mountSeeded(t, s, "seeded", "ns/pr-1", "ns/main")
		first := commitFile(t, s, "ns/pr-1", "first.txt", "first")
		writeFile(t, filepath.Join(v.MergedPath, "seeded.txt"), "seeded")
		res := mustCommit(t, s, "seeded")
		if res.Generation != 2 || res.SeededFrom != nil {
			t.Fatalf("commit = %+v, want generation 2, not seeded", res)
		}
		if got := layerIDs(mustInspect(t, s, "ns/pr-1").Layers); !slices.Equal(got, []string{res.Layer, first.Layer}) {
			t.Errorf("pr-1 layers = %v, want the seeded volume's on the first build's", got)
		}
	})
	t.Run("a plain mount made an empty head", func(t *testing.T) {
		plain := mustMount(t, s, "plain", "ns/pr-2")
		v := mountSeeded(t, s, "seeded2", "ns/pr-2", "ns/main")
		if v.SeededFrom == nil {
			t.Fatal("an empty head kept the volume from being seeded")
		}
		writeFile(t, filepath.Join(v.MergedPath, "seeded.txt"), "seeded")
		res := mustCommit(t, s, "seeded2")
		info := mustInspect(t, s, "ns/pr-2")
		if res.SeededFrom == nil || len(info.Layers) != 2 || info.SeededFrom == nil {
			t.Fatalf("commit %+v, cache %+v: want pr-2 seeded from main", res, info)
		}
		// The plain volume of the same incarnation still commits, on top.
		writeFile(t, filepath.Join(plain, "plain.txt"), "plain")
		if res := mustCommit(t, s, "plain"); res.Generation != 2 || res.Dropped {
			t.Errorf("plain commit = %+v, want generation 2", res)
		}
		got := view(t, s, "ns/pr-2")
		for _, f := range []string{"main.txt", "seeded.txt", "plain.txt"} {
			if _, ok := got[f]; !ok {
				t.Errorf("pr-2 lacks %s: %v", f, got)
			}
		}
	})
	assertNoOrphans(t, s)
}

// Shared layers outlive the removal or squash of either cache: a layer
// exists iff a head or a volume record names it.
func TestSharedLayersOutliveTheOtherCache(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, s *Store)
		kept string // the cache that must read as before
	}{
		{"remove fallback", func(t *testing.T, s *Store) { must(t, s.Remove(ctx, mustRef(t, "ns/main"))) }, "ns/pr-1"},
		{"remove seeded", func(t *testing.T, s *Store) { must(t, s.Remove(ctx, mustRef(t, "ns/pr-1"))) }, "ns/main"},
		{"squash fallback", func(t *testing.T, s *Store) { squashed(t, s, "ns/main") }, "ns/pr-1"},
		{"squash seeded", func(t *testing.T, s *Store) { squashed(t, s, "ns/pr-1") }, "ns/main"},
		{"gc of the fallback by age", func(t *testing.T, s *Store) {
			h, err := s.readHead(mustRef(t, "ns/main"))
			must(t, err)
			h.LastUsed = h.LastUsed.AddDate(-1, 0, 0)
			must(t, s.writeHead(h))
			res, err := s.GC(ctx, GCOptions{MaxAge: 24 * time.Hour})
			must(t, err)
			if len(res.RemovedCaches) != 1 {
				t.Fatalf("GC = %+v, want main removed", res)
			}
		}, "ns/pr-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, Options{})
			buildChain(t, s, "ns/main", layerSteps)
			v := mountSeeded(t, s, "pr", "ns/pr-1", "ns/main")
			writeFile(t, filepath.Join(v.MergedPath, "pr.txt"), "pr")
			fixTimes(t, v.MergedPath)
			mustCommit(t, s, "pr")
			before := view(t, s, tc.kept)
			tc.do(t, s)
			if d := diffSnapshots(before, view(t, s, tc.kept)); d != "" {
				t.Errorf("%s changed: %s", tc.kept, d)
			}
			assertNoOrphans(t, s)
		})
	}
}

func squashed(t *testing.T, s *Store, cache string) {
	t.Helper()
	res, err := s.Squash(context.Background(), mustRef(t, cache), 1)
	must(t, err)
	if !res.Squashed {
		t.Fatalf("Squash(%s) = %+v, want squashed", cache, res)
	}
}

// The fallback may go while a seeded volume is in use: the volume's record
// keeps the seed's layers, and its commit still creates the cache on them.
func TestSeededCommitAfterTheFallbackWasRemoved(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	buildChain(t, s, "ns/main", layerSteps)
	want := view(t, s, "ns/main")
	v := mountSeeded(t, s, "pr", "ns/pr-1", "ns/main")
	must(t, s.Remove(ctx, mustRef(t, "ns/main")))
	if _, err := s.GC(ctx, GCOptions{}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v.MergedPath, "pr.txt"), "pr")
	fixTimes(t, v.MergedPath)
	if res := mustCommit(t, s, "pr"); res.SeededFrom == nil {
		t.Fatalf("commit = %+v, want seeded", res)
	}
	got := view(t, s, "ns/pr-1")
	delete(got, "pr.txt")
	if d := diffSnapshots(want, got); d != "" {
		t.Errorf("pr-1 is not main's layers plus its own: %s", d)
	}
	assertNoOrphans(t, s)
}

// GC's MaxBytes counts a layer two caches share once.
func TestGCCountsSharedLayersOnce(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	commitFile(t, s, "ns/main", "big", strings.Repeat("x", 1<<20))
	v := mountSeeded(t, s, "pr", "ns/pr-1", "ns/main")
	writeFile(t, filepath.Join(v.MergedPath, "small"), "y")
	mustCommit(t, s, "pr")
	main, pr := mustInspect(t, s, "ns/main"), mustInspect(t, s, "ns/pr-1")
	if pr.Bytes <= main.Bytes {
		t.Fatalf("pr-1 takes %d bytes, main %d: per-cache Bytes should include the shared layer", pr.Bytes, main.Bytes)
	}
	// The store holds main's layer and pr-1's small one: pr.Bytes, well
	// under main.Bytes + pr.Bytes.
	res, err := s.GC(ctx, GCOptions{MaxBytes: pr.Bytes})
	must(t, err)
	if len(res.RemovedCaches) != 0 {
		t.Fatalf("GC removed %v although the store holds %d bytes, its bound", res.RemovedCaches, pr.Bytes)
	}
	// One byte less: the least recently used cache (main) goes, which
	// frees nothing pr-1 names, so pr-1 goes too.
	res, err = s.GC(ctx, GCOptions{MaxBytes: pr.Bytes - 1})
	must(t, err)
	if len(res.RemovedCaches) != 2 {
		t.Fatalf("GC removed %v, want both caches", res.RemovedCaches)
	}
	assertNoOrphans(t, s)
}

func TestMountRefusesBadFallbacks(t *testing.T) {
	s := newTestStore(t, Options{})
	commitFile(t, s, "ns/main", "f", "main")
	for _, tc := range []struct {
		name string
		opts MountOptions
		want string
	}{
		{"other layout", MountOptions{Layout: LayoutSnapshot, Fallbacks: []CacheRef{{"ns", "main"}}}, "cannot start from it"},
		{"too many", MountOptions{Fallbacks: []CacheRef{{"ns", "a"}, {"ns", "b"}, {"ns", "c"}, {"ns", "d"}, {"ns", "e"}, {"ns", "f"}}}, "at most 5"},
		{"invalid name", MountOptions{Fallbacks: []CacheRef{{"ns", "Main"}}}, `fallback "ns/Main"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Cache = mustRef(t, "ns/pr")
			_, err := s.Mount(context.Background(), "v", tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Mount = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	assertNoCache(t, s, "ns/pr")
}

// setupSeededCommit makes ns/main of two layers and a pending volume of
// ns/c seeded from it, with changes and a commit marker.
func setupSeededCommit(t testing.TB, s *Store) {
	buildChain(t, s, "ns/main", layerSteps[:2])
	merged := mountSeeded(t, s, "pending", "ns/c", "ns/main").MergedPath
	layerSteps[2](t, merged)
	writeFile(t, filepath.Join(merged, ControlDir, "commit"), "")
	fixTimes(t, merged)
}

// checkSeededCrash: after a crash in a seeded commit, ns/c is absent or
// exactly ns/main's layers plus one, seeded from ns/main@2, and ns/main is
// as the completed run (ref) left it: untouched.
func checkSeededCrash(t *testing.T, s, ref *Store) {
	t.Helper()
	ctx := context.Background()
	main := mustInspect(t, s, "ns/main")
	if want := mustInspect(t, ref, "ns/main"); main.Generation != want.Generation || len(main.Layers) != len(want.Layers) || main.SeededFrom != nil {
		t.Fatalf("ns/main changed: %+v, want generation %d with %d layers", main, want.Generation, len(want.Layers))
	}
	if d := diffSnapshots(view(t, ref, "ns/main"), view(t, s, "ns/main")); d != "" {
		t.Fatalf("ns/main's view changed: %s", d)
	}
	c, err := s.Inspect(ctx, CacheRef{"ns", "c"})
	if errors.Is(err, ErrNotFound) {
		return
	}
	must(t, err)
	if len(c.Layers) != len(main.Layers)+1 || !slices.Equal(layerIDs(c.Layers[1:]), layerIDs(main.Layers)) {
		t.Fatalf("ns/c has layers %v, want one layer on ns/main's %v", layerIDs(c.Layers), layerIDs(main.Layers))
	}
	if want := (Seed{Cache: CacheRef{"ns", "main"}, Generation: main.Generation}); c.SeededFrom == nil || *c.SeededFrom != want {
		t.Fatalf("ns/c seeded from %v, want %v", c.SeededFrom, want)
	}
}

// The seed is in the volume's record, written before the mount, and the
// record alone keeps the seed's layers: a remount after a reboot finds
// them though the fallback was removed and swept meanwhile.
func TestSeedRecordedBeforeMountAndRemounted(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	commitFile(t, s, "ns/main", "main.txt", "main")
	main := mustInspect(t, s, "ns/main")
	v := mountSeeded(t, s, "pr", "ns/pr-1", "ns/main")
	r, err := s.readVolumeRecord("pr")
	must(t, err)
	if r.SeededFrom == nil || !slices.Equal(layerIDs(r.SeedLayers), layerIDs(main.Layers)) || !slices.Equal(r.Layers, layerIDs(main.Layers)) {
		t.Fatalf("record %+v lacks the seed %v", r, layerIDs(main.Layers))
	}
	must(t, s.Remove(ctx, mustRef(t, "ns/main")))
	if _, err := s.GC(ctx, GCOptions{}); err != nil {
		t.Fatal(err)
	}
	must(t, ondisk.Unmount(v.MergedPath)) // what a reboot leaves
	res, err := s.Recover(ctx)
	must(t, err)
	if !slices.Contains(res.Remounted, "pr") {
		t.Fatalf("Recover = %+v, want pr remounted", res)
	}
	if got := readFile(t, filepath.Join(v.MergedPath, "main.txt")); got != "main" {
		t.Errorf("main.txt = %q after the remount", got)
	}
	must(t, s.Discard(ctx, "pr"))
	assertNoCache(t, s, "ns/pr-1")
	assertNoOrphans(t, s)
	if entries, _ := os.ReadDir(s.layersDir()); len(entries) != 0 {
		t.Errorf("layers left after the last name of the seed went: %v", entries)
	}
}

// A mount waits for a busy fallback's lock only so long (two new caches
// falling back to each other could otherwise wait for each other), then
// reads its head unlocked: a whole generation, as heads are replaced whole.
func TestSeedWaitsForTheFallbacksLockOnlySoLong(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	commitFile(t, s, "ns/main", "main.txt", "main")
	l, err := s.lockCache(ctx, mustRef(t, "ns/main"))
	must(t, err)
	defer l.Unlock()
	start := time.Now()
	v := mountSeeded(t, s, "pr", "ns/pr-1", "ns/main")
	if took := time.Since(start); took < fallbackLockWait || took > 3*fallbackLockWait {
		t.Errorf("mount took %s with the fallback's lock held, want about %s", took, fallbackLockWait)
	}
	if v.SeededFrom == nil || readFile(t, filepath.Join(v.MergedPath, "main.txt")) != "main" {
		t.Errorf("volume %+v not seeded from the unlocked read", v)
	}
}

// TestSeedKeepsTheFallbacksBlobs: a seeded layer of a fallback published
// through a registry keeps its digest with the repository it lives in,
// and is unpublished to the seeded cache until its own digest is set.
func TestSeedKeepsTheFallbacksBlobs(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	main := mustRef(t, "ns/main")
	commitFile(t, s, "ns/main", "a.txt", "a")
	commitFile(t, s, "ns/main", "b.txt", "b")
	commitFile(t, s, "ns/main", "local.txt", "not published")
	info := mustInspect(t, s, "ns/main")
	digests := []string{"sha256:" + strings.Repeat("b", 64), "sha256:" + strings.Repeat("a", 64)}
	for i, l := range info.Layers[1:] { // the newest stays unpublished
		if err := s.SetLayerDigest(ctx, main, l.ID, digests[i]); err != nil {
			t.Fatal(err)
		}
	}

	const repo = "registry.example/caches/ns/main"
	v, err := s.Mount(ctx, "pr-a", MountOptions{Cache: mustRef(t, "ns/pr-1"), Fallbacks: []CacheRef{main},
		FallbackRepositories: map[CacheRef]string{main: repo}})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v.MergedPath, "pr.txt"), "pr")
	mustCommit(t, s, "pr-a")

	pr := mustInspect(t, s, "ns/pr-1")
	if len(pr.Layers) != 4 {
		t.Fatalf("pr-1 has %d layers, want its own on main's 3", len(pr.Layers))
	}
	want := []LayerInfo{{}, {}, {Digest: digests[0], MountFrom: repo}, {Digest: digests[1], MountFrom: repo}}
	for i, l := range pr.Layers {
		if l.Digest != want[i].Digest || l.MountFrom != want[i].MountFrom || l.published() {
			t.Errorf("pr-1 layer %d: digest %q mountFrom %q published %v; want digest %q mountFrom %q, unpublished",
				i, l.Digest, l.MountFrom, l.published(), want[i].Digest, want[i].MountFrom)
		}
	}
	// main's own layers are untouched.
	for _, l := range mustInspect(t, s, "ns/main").Layers {
		if l.MountFrom != "" {
			t.Errorf("main's layer %s got MountFrom %q", l.ID, l.MountFrom)
		}
	}

	// Publishing it to pr-1's repository clears MountFrom.
	if err := s.SetLayerDigest(ctx, mustRef(t, "ns/pr-1"), pr.Layers[3].ID, digests[1]); err != nil {
		t.Fatal(err)
	}
	if l := mustInspect(t, s, "ns/pr-1").Layers[3]; l.MountFrom != "" || !l.published() {
		t.Errorf("after SetLayerDigest: mountFrom %q published %v, want none and published", l.MountFrom, l.published())
	}

	// Without the fallback's repository, the digests go.
	v, err = s.Mount(ctx, "pr-b", MountOptions{Cache: mustRef(t, "ns/pr-2"), Fallbacks: []CacheRef{main}})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v.MergedPath, "pr.txt"), "pr 2")
	mustCommit(t, s, "pr-b")
	for _, l := range mustInspect(t, s, "ns/pr-2").Layers {
		if l.Digest != "" || l.MountFrom != "" {
			t.Errorf("pr-2 (no repository for main) layer %s: digest %q mountFrom %q, want neither", l.ID, l.Digest, l.MountFrom)
		}
	}
}

// A seeded cache squashed before its first publish (a registry outage, or
// a fallback near MaxLayers) merges its own commit with the fallback's
// layers: the squash is unpublished, so its commit is pushed, never
// counted as published for the fallback's digests (issue 33, finding 4).
func TestSquashOfASeededCacheBeforeItsFirstPublishStaysUnpublished(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	main := mustRef(t, "ns/main")
	commitFile(t, s, "ns/main", "a.txt", "a")
	commitFile(t, s, "ns/main", "b.txt", "b")
	for i, l := range mustInspect(t, s, "ns/main").Layers {
		must(t, s.SetLayerDigest(ctx, main, l.ID, "sha256:"+strings.Repeat(string(rune('a'+i)), 64)))
	}
	v, err := s.Mount(ctx, "pr", MountOptions{Cache: mustRef(t, "ns/pr-1"), Fallbacks: []CacheRef{main},
		FallbackRepositories: map[CacheRef]string{main: "registry.example/caches/ns/main"}})
	must(t, err)
	writeFile(t, filepath.Join(v.MergedPath, "pr.txt"), "the build's output")
	mustCommit(t, s, "pr")

	res, err := s.Squash(ctx, mustRef(t, "ns/pr-1"), 1)
	must(t, err)
	if !res.Squashed {
		t.Fatalf("Squash = %+v, want the seeded cache's layers merged", res)
	}
	layers := mustInspect(t, s, "ns/pr-1").Layers
	if len(layers) != 1 || layers[0].published() || len(layers[0].Covers) != 0 {
		t.Fatalf("after the squash: %+v; want one unpublished layer that covers nothing", layers)
	}
}
