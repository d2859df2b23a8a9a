package layerfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fixedTime keeps fixture mtimes equal across runs, so that snapshots of
// separately built stores compare equal.
var fixedTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// layerSteps build a chain that uses every feature a merged view can show:
// content, modes with set-id bits, owners, xattrs, symlinks, hardlinks,
// device nodes, fifos, deletions (whiteouts) and replaced directories
// (opaque directories).
var layerSteps = []func(t testing.TB, dir string){
	func(t testing.TB, d string) {
		writeFile(t, filepath.Join(d, "keep.txt"), "keep")
		writeFile(t, filepath.Join(d, "change.txt"), "v1")
		writeFile(t, filepath.Join(d, "gone.txt"), "soon deleted")
		writeFile(t, filepath.Join(d, "tool"), "#!/bin/sh\n")
		must(t, os.Chmod(filepath.Join(d, "tool"), 0o4755))
		must(t, os.Chown(filepath.Join(d, "keep.txt"), 1234, 5678))
		must(t, unix.Setxattr(filepath.Join(d, "keep.txt"), "user.origin", []byte("layer1"), 0))
		must(t, os.Symlink("keep.txt", filepath.Join(d, "link")))
		writeFile(t, filepath.Join(d, "hard/a"), "shared inode")
		must(t, os.Link(filepath.Join(d, "hard/a"), filepath.Join(d, "hard/b")))
		must(t, unix.Mkfifo(filepath.Join(d, "fifo"), 0o600))
		must(t, unix.Mknod(filepath.Join(d, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		writeFile(t, filepath.Join(d, "replaced/old-1"), "x")
		writeFile(t, filepath.Join(d, "replaced/sub/old-2"), "x")
		writeFile(t, filepath.Join(d, "tree/a/b/c.txt"), "deep")
	},
	func(t testing.TB, d string) {
		writeFile(t, filepath.Join(d, "change.txt"), "v2")
		must(t, os.Remove(filepath.Join(d, "gone.txt")))
		must(t, os.RemoveAll(filepath.Join(d, "replaced")))
		writeFile(t, filepath.Join(d, "replaced/new"), "only this")
		must(t, os.Remove(filepath.Join(d, "link")))
		must(t, os.Symlink("change.txt", filepath.Join(d, "link")))
		must(t, os.Chmod(filepath.Join(d, "tree/a/b/c.txt"), 0o600))
	},
	func(t testing.TB, d string) {
		writeFile(t, filepath.Join(d, "change.txt"), "v3")
		writeFile(t, filepath.Join(d, "gone.txt"), "back again")
		must(t, unix.Setxattr(filepath.Join(d, "tree/a"), "user.dir", []byte("yes"), 0))
		must(t, os.RemoveAll(filepath.Join(d, "tree/a/b")))
	},
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// buildChain commits each step as one layer of cache.
func buildChain(t testing.TB, s *Store, cache string, steps []func(testing.TB, string)) {
	t.Helper()
	for i, step := range steps {
		id := "build-" + randomID()
		merged := mustMount(t, s, id, cache)
		step(t, merged)
		fixTimes(t, merged)
		if res := mustCommit(t, s, id); res.Layer == "" {
			t.Fatalf("step %d committed nothing", i)
		}
	}
}

func fixTimes(t testing.TB, root string) {
	t.Helper()
	ts := []unix.Timespec{unix.NsecToTimespec(fixedTime.UnixNano()), unix.NsecToTimespec(fixedTime.UnixNano())}
	must(t, filepath.Walk(root, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW)
	}))
}

func TestSquashKeepsMergedView(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	buildChain(t, s, "ns/c", layerSteps)
	before := view(t, s, "ns/c")
	if before["replaced/old-1"] != "" || before["gone.txt"] == "" || before["tree/a/b"] != "" {
		t.Fatalf("fixture did not produce whiteouts and opaque dirs as expected: %v", before)
	}

	res, err := s.Squash(ctx, mustRef(t, "ns/c"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Squashed || res.OldLayers != 3 {
		t.Fatalf("Squash = %+v, want 3 layers squashed", res)
	}
	info, _ := s.Inspect(ctx, mustRef(t, "ns/c"))
	if len(info.Layers) != 1 || info.Generation != 3 {
		t.Fatalf("after squash: %d layers, generation %d; want 1 layer, generation 3", len(info.Layers), info.Generation)
	}
	if diff := diffSnapshots(before, view(t, s, "ns/c")); diff != "" {
		t.Fatalf("squash changed the merged view:\n%s", diff)
	}
	assertNoOrphans(t, s)

	// A shallow head is left alone.
	if res, err := s.Squash(ctx, mustRef(t, "ns/c"), 1); err != nil || res.Squashed {
		t.Fatalf("second Squash = %+v, %v; want nothing to do", res, err)
	}
}

func TestSquashKeepsCommitsThatLandMeanwhile(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	buildChain(t, s, "ns/c", layerSteps)
	cache := mustRef(t, "ns/c")
	h, err := s.readHead(cache)
	must(t, err)
	layer, err := s.mergeLayers(ctx, cache, h.layerIDs())
	must(t, err)

	// A commit lands while the squash copies.
	buildChain(t, s, "ns/c", layerSteps[2:])
	writeFile(t, filepath.Join(mustMount(t, s, "late", "ns/c"), "late.txt"), "late")
	mustCommit(t, s, "late")
	want := view(t, s, "ns/c")

	must(t, s.swapInSquashed(ctx, h, h.Layers, layer))
	info, _ := s.Inspect(ctx, cache)
	if len(info.Layers) != 3 || info.Layers[2].ID != layer.ID {
		t.Fatalf("layers after swap = %+v, want two newer layers on the squashed one", info.Layers)
	}
	if diff := diffSnapshots(want, view(t, s, "ns/c")); diff != "" {
		t.Fatalf("swap changed the merged view:\n%s", diff)
	}
}

func TestVolumesKeepSquashedLayersUntilTheyEnd(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	buildChain(t, s, "ns/c", layerSteps)
	merged := mustMount(t, s, "reader", "ns/c")
	before := snapshot(t, merged)
	if _, err := s.Squash(ctx, mustRef(t, "ns/c"), 1); err != nil {
		t.Fatal(err)
	}
	if diff := diffSnapshots(before, snapshot(t, merged)); diff != "" {
		t.Fatalf("a mounted volume changed under a squash:\n%s", diff)
	}
	must(t, s.Discard(ctx, "reader"))
	assertNoOrphans(t, s)
	entries, _ := os.ReadDir(s.layersDir())
	if len(entries) != 1 {
		t.Fatalf("%d layer dirs after the last user ended, want 1", len(entries))
	}
}
