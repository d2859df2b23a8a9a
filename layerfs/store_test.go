package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/overlay"
)

func TestCommitsStackPerFile(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	const cache = "ci/maven"

	// Two builds of one cache at once, each writing its own file and both
	// writing shared.txt; committed one after the other.
	a := mustMount(t, s, "vol-a", cache)
	b := mustMount(t, s, "vol-b", cache)
	writeFile(t, filepath.Join(a, "a.txt"), "from a")
	writeFile(t, filepath.Join(b, "b.txt"), "from b")
	writeFile(t, filepath.Join(a, "shared.txt"), "a")
	writeFile(t, filepath.Join(b, "shared.txt"), "b")

	// Writes are private until committed.
	assertMissing(t, filepath.Join(b, "a.txt"))
	c := mustMount(t, s, "vol-c", cache)
	assertMissing(t, filepath.Join(c, "a.txt"))

	if res := mustCommit(t, s, "vol-a"); res.Generation != 1 || res.Layer == "" {
		t.Fatalf("first commit = %+v, want generation 1 with a layer", res)
	}
	if res := mustCommit(t, s, "vol-b"); res.Generation != 2 {
		t.Fatalf("second commit = %+v, want generation 2", res)
	}
	// A volume mounted before the commits keeps its own view.
	assertMissing(t, filepath.Join(c, "a.txt"))

	d := mustMount(t, s, "vol-d", cache)
	for file, want := range map[string]string{"a.txt": "from a", "b.txt": "from b", "shared.txt": "b"} {
		if got := readFile(t, filepath.Join(d, file)); got != want {
			t.Errorf("%s = %q, want %q (later commit wins per file)", file, got, want)
		}
	}

	// A deletion in an upper layer hides the file from later mounts.
	if err := os.Remove(filepath.Join(d, "a.txt")); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, "vol-d")
	e := mustMount(t, s, "vol-e", cache)
	assertMissing(t, filepath.Join(e, "a.txt"))
	if got := readFile(t, filepath.Join(e, "b.txt")); got != "from b" {
		t.Errorf("b.txt = %q after deleting a.txt", got)
	}
	for _, id := range []string{"vol-c", "vol-e"} {
		if err := s.Discard(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	info, err := s.Inspect(ctx, mustRef(t, cache))
	if err != nil {
		t.Fatal(err)
	}
	if info.Generation != 3 || len(info.Layers) != 3 || info.LastWriter != "vol-d" || len(info.Volumes) != 0 {
		t.Errorf("Inspect = %+v, want generation 3, 3 layers, last writer vol-d, no volumes", info)
	}
}

func TestCommitWithoutChangesAddsNoLayer(t *testing.T) {
	s := newTestStore(t, Options{})
	writeFile(t, filepath.Join(mustMount(t, s, "v1", "ns/c"), "f"), "x")
	mustCommit(t, s, "v1")
	mustMount(t, s, "v2", "ns/c")
	res := mustCommit(t, s, "v2")
	if res.Generation != 1 || res.Layer != "" {
		t.Fatalf("empty commit = %+v, want generation 1 and no layer", res)
	}
	if _, err := s.Volume(context.Background(), "v2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("volume after commit: %v, want ErrNotFound", err)
	}
}

func TestMountIsIdempotentAndRemounts(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	merged := mustMount(t, s, "v", "ns/c")
	writeFile(t, filepath.Join(merged, "kept"), "yes")
	if again := mustMount(t, s, "v", "ns/c"); again != merged {
		t.Fatalf("second Mount = %s, want %s", again, merged)
	}
	if _, err := s.Mount(ctx, "v", MountOptions{Cache: mustRef(t, "ns/other")}); err == nil || !strings.Contains(err.Error(), "already exists for cache ns/c") {
		t.Fatalf("Mount of the volume for another cache: %v", err)
	}
	// A reboot takes the mount away; Recover brings it back with its data.
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
	res, err := s.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Remounted) != 1 || res.Remounted[0] != "v" {
		t.Fatalf("Recover = %+v, want v remounted", res)
	}
	if got := readFile(t, filepath.Join(merged, "kept")); got != "yes" {
		t.Fatalf("after remount kept = %q", got)
	}
}

func TestVolumeRootOwnership(t *testing.T) {
	tests := []struct {
		name     string
		opts     MountOptions
		wantMode uint32
		wantUID  uint32
	}{
		{"default is world-writable for non-root builds", MountOptions{}, 0o777, 0},
		{"configured", MountOptions{UID: 1000, GID: 1000, Mode: 0o750}, 0o750, 1000},
		// Issue 8, item 10: the CLI suggested 01777, which Mount refused.
		{"sticky shared directory", MountOptions{Mode: os.ModeSticky | 0o777}, 0o1777, 0},
		{"setgid group directory", MountOptions{GID: 1000, Mode: os.ModeSetgid | 0o775}, 0o2775, 0},
	}
	s := newTestStore(t, Options{})
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Cache = mustRef(t, "ns/own")
			v, err := s.Mount(context.Background(), fmt.Sprintf("own-%d", i), tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(v.MergedPath, &st); err != nil {
				t.Fatal(err)
			}
			if st.Mode&0o7777 != tt.wantMode || st.Uid != tt.wantUID {
				t.Errorf("root mode=%o uid=%d, want %o %d", st.Mode&0o7777, st.Uid, tt.wantMode, tt.wantUID)
			}
		})
	}
}

func TestReadOnlyVolumeIsNeverCommitted(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	v, err := s.Mount(ctx, "ro", MountOptions{Cache: mustRef(t, "ns/c"), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v.MergedPath, "scratch"), "x")
	if _, err := s.Commit(ctx, "ro"); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("Commit of a read-only volume: %v", err)
	}
	if got := readFile(t, filepath.Join(v.MergedPath, "scratch")); got != "x" {
		t.Fatalf("refused commit lost the volume's data: %q", got)
	}
	if err := s.Discard(ctx, "ro"); err != nil {
		t.Fatal(err)
	}
	if info, _ := s.Inspect(ctx, mustRef(t, "ns/c")); info.Generation != 0 {
		t.Fatalf("generation %d after a read-only use", info.Generation)
	}
}

func TestLongChainMounts(t *testing.T) {
	// 120 layers of ~45-byte paths exceed mount(2)'s one page of options.
	s := newTestStore(t, Options{MaxLayers: 400})
	for i := range 120 {
		id := fmt.Sprintf("v%d", i)
		writeFile(t, filepath.Join(mustMount(t, s, id, "ns/deep"), fmt.Sprintf("f%03d", i)), "x")
		mustCommit(t, s, id)
	}
	merged := mustMount(t, s, "top", "ns/deep")
	entries, err := os.ReadDir(merged)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 120 {
		t.Fatalf("merged view has %d files, want 120", len(entries))
	}
}

func TestConcurrentCommitsAllLand(t *testing.T) {
	s := newTestStore(t, Options{MaxLayers: 100})
	const n = 8
	for i := range n {
		writeFile(t, filepath.Join(mustMount(t, s, fmt.Sprintf("c%d", i), "ns/c"), fmt.Sprintf("f%d", i)), "x")
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := s.Commit(context.Background(), fmt.Sprintf("c%d", i))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	snap := view(t, s, "ns/c")
	for i := range n {
		if _, ok := snap[fmt.Sprintf("f%d", i)]; !ok {
			t.Errorf("f%d missing after concurrent commits", i)
		}
	}
	if info, _ := s.Inspect(context.Background(), mustRef(t, "ns/c")); info.Generation != n {
		t.Errorf("generation %d, want %d", info.Generation, n)
	}
}

func TestRemoveDropsCommitsOfVolumesInUse(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	writeFile(t, filepath.Join(mustMount(t, s, "old", "ns/c"), "old"), "x")
	mustCommit(t, s, "old")
	writeFile(t, filepath.Join(mustMount(t, s, "busy", "ns/c"), "new"), "x")
	if err := s.Remove(ctx, mustRef(t, "ns/c")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inspect(ctx, mustRef(t, "ns/c")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Inspect after Remove: %v", err)
	}
	if res := mustCommit(t, s, "busy"); !res.Dropped {
		t.Fatalf("commit into a removed cache = %+v, want dropped", res)
	}
	if snap := view(t, s, "ns/c"); len(snap) != 1 {
		t.Fatalf("recreated cache is not empty: %v", snap)
	}
	assertNoOrphans(t, s)
}

func TestGC(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	for _, c := range []string{"ns/old", "ns/big", "ns/fresh", "ns/busy"} {
		writeFile(t, filepath.Join(mustMount(t, s, "w-"+strings.TrimPrefix(c, "ns/"), c), "f"), strings.Repeat("x", 64<<10))
		mustCommit(t, s, "w-"+strings.TrimPrefix(c, "ns/"))
	}
	mustMount(t, s, "in-use", "ns/busy")
	age(t, s, "ns/old", 48*time.Hour)
	age(t, s, "ns/busy", 48*time.Hour)
	age(t, s, "ns/big", time.Hour)

	res, err := s.GC(ctx, GCOptions{MaxAge: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.RemovedCaches) != 1 || res.RemovedCaches[0].String() != "ns/old" || res.RemovedLayers != 1 || res.FreedBytes <= 0 {
		t.Fatalf("GC by age = %+v, want ns/old and its layer removed (ns/busy is in use)", res)
	}
	// Three caches of 64 KiB each: a limit of 150 KiB removes the least
	// recently used one that is not in use.
	res, err = s.GC(ctx, GCOptions{MaxBytes: 150 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.RemovedCaches) != 1 || res.RemovedCaches[0].String() != "ns/big" {
		t.Fatalf("GC by size = %+v, want ns/big removed", res)
	}
	infos, _ := s.List(ctx)
	if len(infos) != 2 {
		t.Fatalf("List after GC = %+v, want ns/busy and ns/fresh", infos)
	}
	assertNoOrphans(t, s)
}

// age sets a cache's last use into the past.
func age(t *testing.T, s *Store, cache string, by time.Duration) {
	t.Helper()
	h, err := s.readHead(mustRef(t, cache))
	if err != nil {
		t.Fatal(err)
	}
	h.LastUsed = time.Now().Add(-by)
	if err := s.writeHead(h); err != nil {
		t.Fatal(err)
	}
}

// assertNoOrphans checks that every layer directory is referenced and no
// temp files remain.
func assertNoOrphans(t *testing.T, s *Store) {
	t.Helper()
	refs, err := s.referencedLayers()
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{s.layersDir(), s.images().Images} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !refs[e.Name()] {
				t.Errorf("orphan %s", filepath.Join(filepath.Base(dir), e.Name()))
			}
		}
	}
	tmp, _ := os.ReadDir(s.tmpDir())
	for _, e := range tmp {
		t.Errorf("leftover in tmp/: %s", e.Name())
	}
	if left := s.atomicWriteLeftovers(); len(left) > 0 {
		t.Errorf("leftover temp files: %v", left)
	}
	assertNoSnapshotOrphans(t, s)
}

func TestBadInputChangesNothing(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	long := strings.Repeat("x", 64)
	tests := []struct {
		name    string
		op      func() error
		wantErr string
	}{
		{"volume with ..", func() error { _, err := s.Mount(ctx, "..", MountOptions{Cache: CacheRef{"ns", "c"}}); return err }, "path separator or '..'"},
		{"absolute volume path", func() error { _, err := s.Mount(ctx, "/etc", MountOptions{Cache: CacheRef{"ns", "c"}}); return err }, "path separator"},
		{"cache with ..", func() error { _, err := s.Mount(ctx, "v", MountOptions{Cache: CacheRef{"ns", ".."}}); return err }, `invalid cache name ".."`},
		{"namespace with /", func() error { _, err := s.Mount(ctx, "v", MountOptions{Cache: CacheRef{"a/b", "c"}}); return err }, "invalid namespace name"},
		{"long cache name", func() error { _, err := s.Mount(ctx, "v", MountOptions{Cache: CacheRef{"ns", long}}); return err }, "64 characters"},
		{"empty cache name", func() error { _, err := s.Mount(ctx, "v", MountOptions{Cache: CacheRef{"ns", ""}}); return err }, "empty"},
		{"bad mode", func() error {
			_, err := s.Mount(ctx, "v", MountOptions{Cache: CacheRef{"ns", "c"}, Mode: os.ModeSetuid | 0o777})
			return err
		}, "setuid means nothing"},
		{"uid past 32 bits", func() error {
			_, err := s.Mount(ctx, "v", MountOptions{Cache: CacheRef{"ns", "c"}, UID: 1 << 32})
			return err
		}, "uid 4294967296 is out of range"},
		{"squash unknown cache", func() error { _, err := s.Squash(ctx, CacheRef{"ns", "nope"}, 1); return err }, "squash cache ns/nope: not found"},
		{"commit unknown volume", func() error { _, err := s.Commit(ctx, "nope"); return err }, "not found"},
		{"discard unknown volume", func() error { return s.Discard(ctx, "nope") }, "not found"},
		{"squash bad cache", func() error { _, err := s.Squash(ctx, CacheRef{"ns", "A"}, 1); return err }, "upper-case"},
		{"remove unknown cache", func() error { return s.Remove(ctx, CacheRef{"ns", "nope"}) }, "not found"},
		{"negative gc bound", func() error { _, err := s.GC(ctx, GCOptions{MinFreeBytes: -1}); return err }, "must not be negative"},
		{"gc min free of 100%", func() error { _, err := s.GC(ctx, GCOptions{MinFreePercent: 100}); return err }, "out of range"},
	}
	before := describeTree(t, s.Root())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	if diff := diffSnapshots(before, describeTree(t, s.Root())); diff != "" {
		t.Errorf("bad input changed the store:\n%s", diff)
	}
}

func TestOpenRefusesRootThatCannotHostOverlay(t *testing.T) {
	requireRoot(t)
	// An overlay cannot be the upper filesystem of another overlay.
	base := t.TempDir()
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := overlay.Spec{Lower: []string{filepath.Join(base, "l")}, Upper: filepath.Join(base, "u"), Work: filepath.Join(base, "w")}
	if err := spec.Mount(filepath.Join(base, "m")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(base) })
	_, err := Open(context.Background(), Options{Root: filepath.Join(base, "m", "store")})
	if err == nil {
		t.Fatal("Open on an overlay root succeeded")
	}
	for _, want := range []string{"cannot host overlay volumes", "filesystem overlay", "use ext4"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestFullDiskKeepsData(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=4m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(root) })
	s := newTestStore(t, Options{Root: root})
	merged := mustMount(t, s, "v", "ns/c")
	writeFile(t, filepath.Join(merged, "data"), "precious")
	// Fill the disk from outside the store.
	filler, err := os.Create(filepath.Join(root, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := filler.Write(chunk); err != nil {
			break
		}
	}
	filler.Close()
	before := describeTree(t, filepath.Join(root, "caches"))

	_, err = s.Mount(ctx, "v2", MountOptions{Cache: mustRef(t, "ns/c")})
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Mount on a full disk: %v", err)
	}
	_, err = s.Commit(ctx, "v")
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Commit on a full disk: %v", err)
	}
	if got := readFile(t, filepath.Join(merged, "data")); got != "precious" {
		t.Fatalf("failed commit lost data: %q", got)
	}
	if diff := diffSnapshots(before, describeTree(t, filepath.Join(root, "caches"))); diff != "" {
		t.Errorf("failed operations changed caches:\n%s", diff)
	}
	// With space back, the same commit succeeds.
	if err := os.Remove(filepath.Join(root, "filler")); err != nil {
		t.Fatal(err)
	}
	if res := mustCommit(t, s, "v"); res.Generation != 1 {
		t.Fatalf("retried commit = %+v", res)
	}
	if got := view(t, s, "ns/c")["data"]; got == "" {
		t.Fatal("committed data missing")
	}
}

func TestVolumeLabelsAreKeptAndBounded(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	labels := map[string]string{"owner": "ns/pod", "commit": "on-success"}
	if _, err := s.Mount(ctx, "v", MountOptions{Cache: mustRef(t, "ns/c"), Labels: labels}); err != nil {
		t.Fatal(err)
	}
	// A later mount of the same volume (a retry) keeps the first labels.
	if _, err := s.Mount(ctx, "v", MountOptions{Cache: mustRef(t, "ns/c"), Labels: map[string]string{"owner": "other"}}); err != nil {
		t.Fatal(err)
	}
	vols, err := s.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || vols[0].Labels["owner"] != "ns/pod" || vols[0].Labels["commit"] != "on-success" {
		t.Fatalf("Volumes = %+v, want v with its first labels", vols)
	}
	_, err = s.Mount(ctx, "w", MountOptions{Cache: mustRef(t, "ns/c"), Labels: map[string]string{"big": strings.Repeat("x", MaxLabelBytes)}})
	if err == nil || !strings.Contains(err.Error(), "labels take 4099 bytes") {
		t.Fatalf("Mount with oversized labels: %v", err)
	}
}
