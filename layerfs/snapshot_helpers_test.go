package layerfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// testImageBytes is the size of the btrfs images the snapshot tests make:
// sparse, so it costs only what they write.
const testImageBytes = 1 << 30

// requireBtrfs fails (never skips) a test that needs btrfs tools.
func requireBtrfs(t testing.TB) {
	t.Helper()
	requireRoot(t)
	for _, tool := range []string{"mkfs.btrfs", "btrfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s: install btrfs-progs (make test-deps, or apt-get install btrfs-progs)", tool)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Fatalf("needs loop devices: modprobe loop (%v)", err)
	}
}

// snapshotRoots are the two places a snapshot store can stand: a root
// that is not btrfs (layerfs makes, formats and loop-mounts its own
// image), and a root on btrfs (snapshot/ is a plain directory).
var snapshotRoots = []string{"image", "btrfs"}

// newSnapshotStore opens a store for snapshot caches on the given kind of
// root, and checks when the test ends that nothing of it stays mounted or
// attached to a loop device.
func newSnapshotStore(t testing.TB, kind string) *Store {
	t.Helper()
	requireBtrfs(t)
	opts := Options{SnapshotImageBytes: testImageBytes}
	switch kind {
	case "image":
		opts.Root = t.TempDir() // ext4 here; layerfs makes snapshot.img
	case "btrfs":
		opts.Root = btrfsRoot(t)
	default:
		t.Fatalf("newSnapshotStore: unknown kind %q", kind)
	}
	t.Cleanup(func() { assertReleased(t, opts.Root) }) // runs after the unmounts below
	return newTestStore(t, opts)
}

// btrfsRoot mounts a fresh btrfs image (through mount(8), with autoclear)
// and returns a store root on it.
func btrfsRoot(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(t.TempDir(), "btrfs.img")
	f, err := os.Create(img)
	must(t, err)
	must(t, f.Truncate(testImageBytes))
	must(t, f.Close())
	run(t, "mkfs.btrfs", "-q", "-f", img)
	run(t, "mount", "-o", "loop", img, dir)
	t.Cleanup(func() {
		if err := unmountAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		assertReleased(t, img)
	})
	root := filepath.Join(dir, "store")
	must(t, os.Mkdir(root, 0o755))
	return root
}

// assertReleased fails if anything is mounted under path or a loop device
// is still backed by a file under it. Autoclear frees a loop device just
// after its last unmount, so the check waits a little.
func assertReleased(t testing.TB, path string) {
	t.Helper()
	var held []string
	for range 100 {
		held = held[:0]
		mounts, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(path))
		for _, m := range mounts {
			held = append(held, "mount "+m.Mountpoint)
		}
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), path) {
				held = append(held, f+" -> "+strings.TrimSpace(string(b)))
			}
		}
		if len(held) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("left behind: %s", strings.Join(held, "; "))
}

// mountSnapshot mounts volume id of cache with the snapshot layout.
func mountSnapshot(t testing.TB, s *Store, id, cache string, opts MountOptions) *Volume {
	t.Helper()
	opts.Cache, opts.Layout = mustRef(t, cache), LayoutSnapshot
	v, err := s.Mount(context.Background(), id, opts)
	if err != nil {
		t.Fatalf("Mount(%s, %s, snapshot): %v", id, cache, err)
	}
	return v
}

// buildSnapshot mounts a snapshot volume, writes files and commits it.
func buildSnapshot(t testing.TB, s *Store, id, cache string, files map[string]string) CommitResult {
	t.Helper()
	v := mountSnapshot(t, s, id, cache, MountOptions{})
	for name, content := range files {
		writeFile(t, filepath.Join(v.MergedPath, name), content)
	}
	fixTimes(t, v.MergedPath) // crash tests compare caches built apart
	return mustCommit(t, s, id)
}

// subvolumes lists the entries of snapshot/generations and
// snapshot/volumes.
func subvolumes(t testing.TB, s *Store) (gens, vols []string) {
	t.Helper()
	for _, d := range []struct {
		dir  string
		into *[]string
	}{{s.snapshots.GenerationsDir(), &gens}, {s.snapshots.VolumesDir(), &vols}} {
		entries, err := os.ReadDir(d.dir)
		must(t, err)
		for _, e := range entries {
			*d.into = append(*d.into, e.Name())
		}
	}
	return gens, vols
}

// assertNoSnapshotOrphans checks that every subvolume is named by a head
// or a volume record, and every qgroup belongs to a live subvolume.
func assertNoSnapshotOrphans(t testing.TB, s *Store) {
	t.Helper()
	if !ondisk.Exists(s.snapshots.GenerationsDir()) {
		return
	}
	gens, vols, err := s.snapshotRefs()
	must(t, err)
	g, v := subvolumes(t, s)
	for _, id := range g {
		if !gens[id] {
			t.Errorf("orphan generation subvolume %s", id)
		}
	}
	for _, id := range v {
		if !vols[id] {
			t.Errorf("orphan volume subvolume %s", id)
		}
	}
}

// cacheLayout is the layout a view of cache must be mounted with.
func cacheLayout(s *Store, cache string) Layout {
	ref, err := ParseCacheRef(cache)
	if err != nil {
		return ""
	}
	if h, err := s.readHead(ref); err == nil {
		return h.Layout
	}
	return ""
}
