package layerfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A build on a snapshot volume is a tenant the store does not trust: it
// runs unprivileged, but btrfs lets any user nest subvolumes (issue 33,
// finding 1).

// asNobody runs a command as uid and gid 65534, as an unprivileged build
// would, and returns its combined output and error.
func asNobody(t testing.TB, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", name}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// traversable lets every user through the directories above path (a
// test's temporary directories are root's alone), as a pod's bind mount
// of the volume lets its build in.
func traversable(t testing.TB, path string) {
	t.Helper()
	for dir := filepath.Dir(path); dir != "/" && dir != os.TempDir(); dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		must(t, err)
		must(t, os.Chmod(dir, st.Mode().Perm()|0o111))
	}
}

func TestSnapshotNestedSubvolumeCountsAgainstLimit(t *testing.T) {
	for _, kind := range snapshotRoots {
		t.Run(kind, func(t *testing.T) {
			s := newSnapshotStore(t, kind)
			buildSnapshot(t, s, "base", "ns/c", map[string]string{"f": "1"})
			v := mountSnapshot(t, s, "v", "ns/c", MountOptions{UID: 65534, GID: 65534, Mode: 0o755, LimitBytes: 8 << 20})
			traversable(t, v.MergedPath)
			nested := filepath.Join(v.MergedPath, "nested")
			if out, err := asNobody(t, "btrfs", "subvolume", "create", nested); err != nil {
				t.Fatalf("an unprivileged build nests a subvolume: %v\n%s", err, out)
			}
			if out, err := asNobody(t, "btrfs", "subvolume", "create", filepath.Join(nested, "deeper")); err != nil {
				t.Fatalf("an unprivileged build nests a second level: %v\n%s", err, out)
			}
			out, err := asNobody(t, "dd", "if=/dev/urandom", "of="+filepath.Join(nested, "deeper", "big"), "bs=1M", "count=64", "conv=fsync")
			if err == nil || !strings.Contains(out, "quota exceeded") {
				t.Fatalf("writing 64 MiB into a subvolume nested in a volume limited to 8 MiB: %v\n%s\nwant Disk quota exceeded", err, out)
			}
			// The volume commits (the nested subvolumes are empty
			// directories in its generation, as btrfs snapshots them), and
			// its subvolume goes at its end with everything nested in it.
			mustCommit(t, s, "v")
			if _, vols := subvolumes(t, s); len(vols) != 0 {
				t.Errorf("volume subvolumes after the commit: %v", vols)
			}
			if _, err := s.GC(context.Background(), GCOptions{}); err != nil {
				t.Errorf("GC after a volume with nested subvolumes: %v", err)
			}
			assertNoOrphans(t, s)
		})
	}
}

// A leftover the sweep cannot delete (here an immutable file, which not
// even root may remove) is reported, and never keeps the sweep, GC or
// Recover from deleting everything else.
func TestSweepGoesOnPastAnEntryItCannotDelete(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "a", "ns/gone", map[string]string{"f": "1"})
	buildSnapshot(t, s, "b", "ns/old", map[string]string{"f": "1"})
	stuck := filepath.Join(s.snapshots.GenerationsDir(), "0000-stuck") // sorts first
	writeFile(t, filepath.Join(stuck, "f"), "x")
	run(t, "chattr", "+i", filepath.Join(stuck, "f"))
	t.Cleanup(func() { run(t, "chattr", "-i", filepath.Join(stuck, "f")) })

	if err := s.Remove(ctx, mustRef(t, "ns/gone")); err == nil || !strings.Contains(err.Error(), stuck) {
		t.Errorf("Remove with an entry the sweep cannot delete: %v, want an error naming %s", err, stuck)
	}
	res, err := s.GC(ctx, GCOptions{MaxBytes: 1})
	if err == nil || !strings.Contains(err.Error(), stuck) {
		t.Errorf("GC past an entry it cannot delete: %v, want an error naming %s", err, stuck)
	}
	if len(res.RemovedCaches) != 1 || res.RemovedCaches[0] != mustRef(t, "ns/old") {
		t.Errorf("GC removed %v, want ns/old", res.RemovedCaches)
	}
	if gens, vols := subvolumes(t, s); len(gens) != 1 || gens[0] != "0000-stuck" || len(vols) != 0 {
		t.Errorf("left after GC: generations %v, volumes %v; want only 0000-stuck", gens, vols)
	}
	rec, err := s.Recover(ctx)
	if err == nil || !rec.Finished || !strings.Contains(rec.Unswept, stuck) {
		t.Errorf("Recover past an entry it cannot delete = %+v, %v; want it finished, with the entry in Unswept", rec, err)
	}
}
