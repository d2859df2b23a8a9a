package layerfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// deepDepth nests directories past PATH_MAX (4096): 2,100 levels of "d/".
const deepDepth = 2100

// mkDeep builds deepDepth nested directories under root with a file at
// the bottom, one openat at a time (a path that long cannot be used).
func mkDeep(t testing.TB, root, content string) {
	t.Helper()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	// Closed on every path, or a failed test leaves the mount busy.
	defer func() { unix.Close(fd) }()
	for range deepDepth {
		must(t, unix.Mkdirat(fd, "d", 0o755))
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
	}
	leaf, err := unix.Openat(fd, "leaf", unix.O_WRONLY|unix.O_CREAT, 0o644)
	must(t, err)
	defer unix.Close(leaf)
	_, err = unix.Write(leaf, []byte(content))
	must(t, err)
}

// readDeep reads the file mkDeep made under root.
func readDeep(t testing.TB, root string) string {
	t.Helper()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer func() { unix.Close(fd) }()
	for i := range deepDepth {
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatalf("level %d of %s: %v", i, root, err)
		}
		unix.Close(fd)
		fd = next
	}
	leaf, err := unix.Openat(fd, "leaf", unix.O_RDONLY, 0)
	must(t, err)
	defer unix.Close(leaf)
	buf := make([]byte, 64)
	n, err := unix.Read(leaf, buf)
	must(t, err)
	return string(buf[:n])
}

// Issue 8, item 6: a tree 2,100 directories deep could not be measured
// ("file name too long" in tree.DiskUsage), so its commit failed on every retry,
// and each failure left the volume unmounted. Walks use directory file
// descriptors now, so depth does not matter: commit, squash (copy), GC
// and discard (removal) all handle the tree.
func TestDeepTreeCannotBeMeasured(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	merged := mustMount(t, s, "deep", "ns/c")
	mkDeep(t, merged, "bottom")
	res, err := s.Commit(ctx, "deep")
	if err != nil {
		if !ondisk.IsMountPoint(merged) {
			t.Error("the failed commit left the volume unmounted")
		}
		t.Fatalf("Commit of a %d-deep tree: %v", deepDepth, err)
	}
	if res.Bytes <= 0 {
		t.Errorf("commit measured %d bytes", res.Bytes)
	}
	writeFile(t, filepath.Join(mustMount(t, s, "top", "ns/c"), "top"), "x")
	mustCommit(t, s, "top")
	sq, err := s.Squash(ctx, mustRef(t, "ns/c"), 1)
	if err != nil {
		t.Fatalf("Squash: %v", err)
	}
	info, err := s.Inspect(ctx, mustRef(t, "ns/c"))
	must(t, err)
	if len(info.Layers) != 1 || info.Layers[0].Files < deepDepth {
		t.Errorf("squashed head %+v, want one layer of more than %d entries", info.Layers, deepDepth)
	}
	if got := readDeep(t, s.layerDir(sq.Layer)); got != "bottom" {
		t.Errorf("squashed leaf = %q", got)
	}
	assertNoOrphans(t, s) // the old deep layers were removed

	// Discard of a volume with a deep upper directory.
	scratch := filepath.Join(mustMount(t, s, "scratch", "ns/c"), "scratch")
	must(t, os.Mkdir(scratch, 0o755))
	mkDeep(t, scratch, "scratch")
	must(t, s.Discard(ctx, "scratch"))
	if _, err := os.Lstat(s.volumeDir("scratch")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("discarded deep volume left %s: %v", s.volumeDir("scratch"), err)
	}
}

// Issue 8, item 6: ensureMounted trusted the Mounted flag read before a
// failed commit unmounted the volume, so the failed commit left the volume
// unmounted although the design says it stays mounted.
func TestFailedCommitLeavesVolumeUnmounted(t *testing.T) {
	s := newTestStore(t, Options{})
	merged := mustMount(t, s, "v", "ns/c")
	writeFile(t, filepath.Join(merged, "f"), "kept")
	r, err := s.readVolume("v")
	must(t, err)
	must(t, ondisk.Unmount(merged)) // what a commit does before it fails
	if err := s.ensureMounted(&txn{s: s, Volume: r, volID: "v"}); err != nil {
		t.Fatal(err)
	}
	if !ondisk.IsMountPoint(merged) || readFile(t, filepath.Join(merged, "f")) != "kept" {
		t.Fatal("the volume was not remounted with its data")
	}
}
