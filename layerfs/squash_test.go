package layerfs

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
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
	before := describeTree(t, merged)
	if _, err := s.Squash(ctx, mustRef(t, "ns/c"), 1); err != nil {
		t.Fatal(err)
	}
	if diff := diffSnapshots(before, describeTree(t, merged)); diff != "" {
		t.Fatalf("a mounted volume changed under a squash:\n%s", diff)
	}
	must(t, s.Discard(ctx, "reader"))
	assertNoOrphans(t, s)
	entries, _ := os.ReadDir(s.layersDir())
	if len(entries) != 1 {
		t.Fatalf("%d layer dirs after the last user ended, want 1", len(entries))
	}
}

// Issue 8, item 1: squashing a cache that holds `truncate -s 1T huge.img`
// wrote the whole apparent size as zeros and filled the node. The store is
// on small filesystems, so the old behaviour fails fast with ENOSPC instead
// of filling the machine's disk.
func TestSquashSparseFileFillsNode(t *testing.T) {
	const apparent = 64 << 30
	for _, kind := range []string{"tmpfs", "ext4"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			s := newTestStore(t, Options{Root: smallFS(t, kind, 256<<20)})
			merged := mustMount(t, s, "v1", "ns/c")
			huge := filepath.Join(merged, "huge.img")
			f, err := os.Create(huge)
			must(t, err)
			must(t, f.Truncate(apparent))
			// Data at the start, in the middle and at the very end.
			for _, off := range []int64{0, 1 << 30, 40<<30 + 12345, apparent - 5} {
				_, err := f.WriteAt([]byte("data!"), off)
				must(t, err)
			}
			must(t, f.Close())
			wantMap := dataMap(t, huge)
			mustCommit(t, s, "v1")
			writeFile(t, filepath.Join(mustMount(t, s, "v2", "ns/c"), "small"), "x")
			mustCommit(t, s, "v2")

			res, err := s.Squash(ctx, mustRef(t, "ns/c"), 1)
			if err != nil {
				t.Fatalf("Squash: %v", err)
			}
			squashed := filepath.Join(s.layerDir(res.Layer), "huge.img")
			var st unix.Stat_t
			must(t, unix.Stat(squashed, &st))
			if st.Size != apparent {
				t.Errorf("squashed size %d, want %d", st.Size, int64(apparent))
			}
			t.Logf("squashed %d-byte sparse file allocates %d bytes", st.Size, st.Blocks*512)
			if alloc := st.Blocks * 512; alloc > 1<<20 {
				t.Errorf("squashed file allocates %d bytes, want holes kept (< 1 MiB)", alloc)
			}
			if got := dataMap(t, squashed); !slices.Equal(got, wantMap) {
				t.Errorf("data ranges %v, want %v", got, wantMap)
			}
			info, err := s.Inspect(ctx, mustRef(t, "ns/c"))
			must(t, err)
			if info.Bytes > 1<<20 {
				t.Errorf("cache accounts %d bytes, want allocated blocks (< 1 MiB), not the apparent size", info.Bytes)
			}
			through := filepath.Join(mustMount(t, s, "v3", "ns/c"), "huge.img")
			if got := dataMap(t, through); !slices.Equal(got, wantMap) {
				t.Errorf("data ranges through a mount %v, want %v", got, wantMap)
			}
		})
	}
}

// dataMap lists a file's data ranges as SEEK_DATA/SEEK_HOLE report them,
// with their content, so that two files compare equal when their hole
// layout and data are the same.
func dataMap(t testing.TB, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	fi, err := f.Stat()
	must(t, err)
	var ranges []string
	for off := int64(0); off < fi.Size(); {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		must(t, err)
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		must(t, err)
		buf := make([]byte, min(end-start, 1<<20))
		_, err = f.ReadAt(buf, start)
		must(t, err)
		sum := sha256.Sum256(buf)
		ranges = append(ranges, fmt.Sprintf("%d-%d:%x", start, end, sum[:4]))
		off = end
	}
	return ranges
}

// A crash between a commit's head and the removal of its volume's record
// leaves a record that names a layer of the head: the volume has ended.
// A squash takes that layer out of the head, so it removes such records
// first; the volume must not come back.
func TestSquashEndsLandedVolumes(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	buildChain(t, s, "ns/c", layerSteps[:1])
	writeFile(t, filepath.Join(mustMount(t, s, "v", "ns/c"), "f"), "x")
	record, err := os.ReadFile(s.volumePath("v"))
	must(t, err)
	mustCommit(t, s, "v")
	// The record as the crash left it.
	must(t, os.MkdirAll(s.volumeDir("v"), 0o755))
	must(t, os.WriteFile(s.volumePath("v"), record, 0o644))
	if _, err := s.Volume(ctx, "v"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Volume of a landed record: %v, want ErrNotFound", err)
	}
	if _, err := s.Squash(ctx, mustRef(t, "ns/c"), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Volume(ctx, "v"); !errors.Is(err, ErrNotFound) || ondisk.Exists(s.volumeDir("v")) {
		t.Fatalf("after a squash the landed volume is back: %v (dir exists %v)", err, ondisk.Exists(s.volumeDir("v")))
	}
	assertNoOrphans(t, s)
}
