package layerfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Issue 8, item 2: on a full disk Open failed (its probe creates a
// directory), so the agent could not start, recover or gc; a commit that
// hit ENOSPC after recording its intent stayed "committing" until a manual
// recover. Everything that frees space or ends volumes must still work.
func TestFullDiskStopsStore(t *testing.T) {
	ctx := context.Background()
	root := smallFS(t, "ext4", 64<<20)
	s := newTestStore(t, Options{Root: root})
	for _, c := range []string{"ns/a", "ns/b"} {
		id := "w-" + strings.TrimPrefix(c, "ns/")
		writeFile(t, filepath.Join(mustMount(t, s, id, c), "data"), strings.Repeat("x", 4<<20))
		mustCommit(t, s, id)
	}
	age(t, s, "ns/b", 48*time.Hour)
	keep := mustMount(t, s, "keep", "ns/a")
	writeFile(t, filepath.Join(keep, "precious"), "precious")
	mustMount(t, s, "drop", "ns/a")
	remount := mustMount(t, s, "remount", "ns/a")
	writeFile(t, filepath.Join(remount, "kept"), "yes")
	must(t, unix.Unmount(remount, 0)) // as after a reboot

	// The disk fills up between sealing the volume's upper layer and
	// writing the cache head.
	var filler string
	ondisk.FaultPoint = func() {
		if filler == "" && ondisk.Exists(s.volumePath("keep")) && !ondisk.IsMountPoint(keep) && !ondisk.Exists(overlayLayout{s}.volatileMarker("keep")) {
			filler = fillDisk(t, filepath.Dir(root))
		}
	}
	_, err := s.Commit(ctx, "keep")
	ondisk.FaultPoint = func() {}
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Commit on a full disk: %v, want ENOSPC", err)
	}
	if filler == "" {
		t.Fatal("the disk was never filled")
	}
	v, err := s.Volume(ctx, "keep")
	if err != nil || !v.Mounted {
		t.Fatalf("after a failed commit the volume is %+v, %v; want it mounted", v, err)
	}
	if got := readFile(t, filepath.Join(keep, "precious")); got != "precious" {
		t.Fatalf("failed commit lost data: %q", got)
	}

	// The space the failed commit gave back is taken too.
	filler2 := fillDisk(t, filepath.Dir(root))
	steps := []struct {
		name string
		op   func() error
	}{
		{"open", func() error { _, err := Open(ctx, Options{Root: root}); return err }},
		{"discard", func() error { return s.Discard(ctx, "drop") }},
		{"recover", func() error { _, err := s.Recover(ctx); return err }},
		{"gc", func() error { _, err := s.GC(ctx, GCOptions{MaxAge: 24 * time.Hour}); return err }},
		{"remove", func() error { return s.Remove(ctx, mustRef(t, "ns/a")) }},
	}
	for _, st := range steps {
		if err := st.op(); err != nil {
			t.Errorf("%s on a full disk: %v", st.name, err)
		}
	}
	if got := readFile(t, filepath.Join(remount, "kept")); got != "yes" {
		t.Errorf("recover on a full disk did not remount: %q", got)
	}
	// With space back, the commit is retried and lands (as a dropped
	// commit: its cache was removed meanwhile), with no recover needed.
	must(t, os.Remove(filler))
	must(t, os.Remove(filler2))
	if res := mustCommit(t, s, "keep"); !res.Dropped {
		t.Errorf("retried commit = %+v, want dropped", res)
	}
	if _, err := s.Volume(ctx, "keep"); !errors.Is(err, ErrNotFound) {
		t.Errorf("volume after commit: %v", err)
	}
}

// Issue 8, item 2: Recover returned at the first volume it could not
// repair, leaving every later volume unmounted and the layers unswept.
func TestRecoverStopsAtFirstFailingVolume(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	broken := mustMount(t, s, "a-broken", "ns/a")
	writeFile(t, filepath.Join(mustMount(t, s, "w", "ns/a"), "f"), "x")
	mustCommit(t, s, "w")
	writeFile(t, filepath.Join(mustMount(t, s, "w2", "ns/b"), "f"), "x")
	mustCommit(t, s, "w2")
	ok := mustMount(t, s, "b-ok", "ns/b")
	for _, m := range []string{broken, ok} {
		must(t, unix.Unmount(m, 0))
	}
	// a-broken's only lower layer is the shared empty layer; take it away.
	must(t, os.Rename(s.emptyLayer(), s.emptyLayer()+"-away"))
	res, err := s.Recover(ctx)
	must(t, os.Rename(s.emptyLayer()+"-away", s.emptyLayer()))
	if err == nil || !strings.Contains(err.Error(), `volume "a-broken"`) {
		t.Errorf("Recover error = %v, want one naming a-broken", err)
	}
	if len(res.Remounted) != 1 || res.Remounted[0] != "b-ok" {
		t.Errorf("Remounted = %v, want b-ok (after a-broken failed)", res.Remounted)
	}
	if len(res.Failed) != 1 || res.Failed[0].Volume != "a-broken" || res.Failed[0].Err == nil {
		t.Errorf("Failed = %+v, want a-broken", res.Failed)
	}
	if !ondisk.IsMountPoint(ok) {
		t.Error("b-ok is not mounted")
	}
}

// Issue 8, item 2: the agent needs to evict caches when the node's disk
// runs low, whoever filled it, not only when the store itself is large.
func TestGCMinFree(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name string
		opts func(free, size int64) GCOptions
	}{
		{"bytes", func(free, size int64) GCOptions { return GCOptions{MinFreeBytes: free + 12*mib} }},
		{"percent", func(free, size int64) GCOptions {
			return GCOptions{MinFreePercent: float64(free+12*mib) * 100 / float64(size)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := newTestStore(t, Options{Root: smallFS(t, "ext4", 64*mib)})
			// Oldest first: busy (in use), then c1, c2, c3.
			for i, c := range []string{"ns/busy", "ns/c1", "ns/c2", "ns/c3"} {
				id := "w-" + strings.TrimPrefix(c, "ns/")
				writeFile(t, filepath.Join(mustMount(t, s, id, c), "data"), strings.Repeat("x", 8*mib))
				mustCommit(t, s, id)
				age(t, s, c, time.Duration(10-i)*time.Hour)
			}
			mustMount(t, s, "in-use", "ns/busy")
			var st unix.Statfs_t
			must(t, unix.Statfs(s.Root(), &st))
			free, size := int64(st.Bavail)*st.Bsize, int64(st.Blocks)*st.Bsize
			res, err := s.GC(ctx, tt.opts(free, size))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range res.RemovedCaches {
				got = append(got, c.String())
			}
			if strings.Join(got, ",") != "ns/c1,ns/c2" {
				t.Errorf("GC removed %v, want the two least recently used caches not in use (ns/c1, ns/c2)", got)
			}
			must(t, unix.Statfs(s.Root(), &st))
			if after := int64(st.Bavail) * st.Bsize; after < free+12*mib {
				t.Errorf("free space %d after GC, want at least %d", after, free+12*mib)
			}
		})
	}
}
