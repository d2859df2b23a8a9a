package layerfs

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSnapshotSeedFromFallback: a snapshot cache with no generation
// starts from its first fallback with one, on the node or synced from
// another; its commit creates the cache as a generation of its own,
// which outlives the fallback's next commit and its removal.
func TestSnapshotSeedFromFallback(t *testing.T) {
	for _, tt := range []struct {
		name string
		// main makes cache ns/main on s, built on node a (or on s itself).
		main func(t *testing.T, a, s *Store)
	}{
		{"on the node", func(t *testing.T, _, s *Store) {
			buildSnapshot(t, s, "m", "ns/main", map[string]string{"dep": "from main"})
		}},
		{"across nodes", func(t *testing.T, a, s *Store) {
			buildSnapshot(t, a, "m", "ns/main", map[string]string{"dep": "from main"})
			reg := registry{}
			syncSnapshotCache(t, s, "ns/main", publishSnapshot(t, a, reg, "ns/main", Chain{}), reg.fetch)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			a, s := newSnapshotStore(t, "image"), newSnapshotStore(t, "image")
			tt.main(t, a, s)
			opts := MountOptions{Fallbacks: []CacheRef{{"ns", "none"}, {"ns", "main"}}}
			v := mountSnapshot(t, s, "pr", "ns/pr", opts)
			if got := readFile(t, filepath.Join(v.MergedPath, "dep")); got != "from main" {
				t.Fatalf("seeded volume shows dep = %q, want main's", got)
			}
			if v.SeededFrom == nil || v.SeededFrom.Cache != (CacheRef{"ns", "main"}) {
				t.Errorf("volume SeededFrom = %v, want ns/main", v.SeededFrom)
			}
			writeFile(t, filepath.Join(v.MergedPath, "own"), "pr")
			if res := mustCommit(t, s, "pr"); res.SeededFrom == nil || res.Generation != 1 {
				t.Errorf("Commit = %+v, want generation 1 seeded from ns/main", res)
			}
			buildSnapshot(t, s, "m2", "ns/main", map[string]string{"dep": "main moved on"})
			if err := s.Remove(ctx, mustRef(t, "ns/main")); err != nil {
				t.Fatal(err)
			}
			if _, err := s.GC(ctx, GCOptions{}); err != nil {
				t.Fatal(err)
			}
			for name, want := range map[string]string{"dep": "from main", "own": "pr"} {
				if got := readCacheFile(t, s, "ns/pr", name); got != want {
					t.Errorf("cache ns/pr shows %s = %q, want %q", name, got, want)
				}
			}
			info, err := s.Inspect(ctx, mustRef(t, "ns/pr"))
			if err != nil || info.SeededFrom == nil || info.Bytes < int64(len("from main")) {
				t.Errorf("Inspect = %+v, %v; want a seeded cache whose size counts the seed", info, err)
			}
			assertNoSnapshotOrphans(t, s)
		})
	}
}

// TestSnapshotSeedRules: a seeded volume that does not commit creates
// nothing, a cache with a generation ignores its fallbacks, and a
// fallback of the other layout is refused.
func TestSnapshotSeedRules(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "m", "ns/main", map[string]string{"dep": "main"})
	commitFiles(t, s, "ns/over", map[string]string{"f": "overlay"})
	seeded := MountOptions{Fallbacks: []CacheRef{{"ns", "main"}}}

	mountSnapshot(t, s, "idle", "ns/idle", seeded)
	if res := mustCommit(t, s, "idle"); res.Layer != "" {
		t.Errorf("Commit of an unchanged seeded volume = %+v, want nothing", res)
	}
	if info, err := s.Inspect(ctx, mustRef(t, "ns/idle")); err == nil && info.Generation != 0 {
		t.Errorf("an unchanged seeded volume created the cache: %+v", info)
	}

	buildSnapshot(t, s, "own", "ns/own", map[string]string{"f": "own"})
	v := mountSnapshot(t, s, "again", "ns/own", seeded)
	assertMissing(t, filepath.Join(v.MergedPath, "dep"))
	must(t, s.Discard(ctx, "again"))

	_, err := s.Mount(ctx, "x", MountOptions{Cache: mustRef(t, "ns/new"), Layout: LayoutSnapshot, Fallbacks: []CacheRef{{"ns", "over"}}})
	if !errors.Is(err, ErrLayoutMismatch) {
		t.Errorf("Mount seeded from an overlay cache: %v, want ErrLayoutMismatch", err)
	}
	assertNoSnapshotOrphans(t, s)
}

// TestSnapshotSeededVolumeTornAfterReboot: a seeded volume torn by a
// reboot is made again from its fallback, not empty.
func TestSnapshotSeededVolumeTornAfterReboot(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "m", "ns/main", map[string]string{"dep": "main"})
	v := mountSnapshot(t, s, "pr", "ns/pr", MountOptions{Fallbacks: []CacheRef{{"ns", "main"}}})
	writeFile(t, filepath.Join(v.MergedPath, "half"), "written before the crash")
	// A reboot: the mount is gone and the record is of another boot.
	must(t, unix.Unmount(v.MergedPath, 0))
	must(t, s.transact(ctx, scope{volume: "pr"}, func(t *txn) error { t.Volume.BootID = "an-earlier-boot"; return nil }))
	if res, err := s.Recover(ctx); err != nil || len(res.Torn) != 1 {
		t.Fatalf("Recover = %+v, %v; want volume pr torn", res, err)
	}
	got, err := s.Volume(ctx, "pr")
	must(t, err)
	assertMissing(t, filepath.Join(got.MergedPath, "half"))
	if dep := readFile(t, filepath.Join(got.MergedPath, "dep")); dep != "main" {
		t.Errorf("the torn seeded volume shows dep = %q, want the fallback's", dep)
	}
	must(t, s.Discard(ctx, "pr"))
	assertNoSnapshotOrphans(t, s)
}
