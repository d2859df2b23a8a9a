package layerfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

func TestParseLayout(t *testing.T) {
	for in, want := range map[string]Layout{"": LayoutOverlay, "overlay": LayoutOverlay, "snapshot": LayoutSnapshot} {
		if got, err := ParseLayout(in); err != nil || got != want {
			t.Errorf("ParseLayout(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := ParseLayout("btrfs")
	if err == nil || !strings.Contains(err.Error(), `"overlay"`) || !strings.Contains(err.Error(), `"snapshot"`) {
		t.Errorf("ParseLayout(btrfs) = %v; want an error naming the valid layouts", err)
	}
}

func TestSnapshotMountCommitRemount(t *testing.T) {
	for _, kind := range snapshotRoots {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			s := newSnapshotStore(t, kind)
			v := mountSnapshot(t, s, "a", "ns/c", MountOptions{UID: 1000, GID: 2000, Mode: 0o750})
			if v.Layout != LayoutSnapshot || !v.Mounted {
				t.Fatalf("Mount = %+v, want a mounted snapshot volume", v)
			}
			var st unix.Stat_t
			must(t, unix.Stat(v.MergedPath, &st))
			if st.Uid != 1000 || st.Gid != 2000 || st.Mode&0o7777 != 0o750 {
				t.Errorf("new cache's root is %o %d:%d, want 0750 1000:2000", st.Mode, st.Uid, st.Gid)
			}
			writeFile(t, filepath.Join(v.MergedPath, "dir", "f"), "1")
			res := mustCommit(t, s, "a")
			if res.Layer == "" || res.Generation != 1 || res.Bytes <= 0 {
				t.Fatalf("Commit = %+v, want generation 1 with bytes", res)
			}
			info, err := s.Inspect(ctx, CacheRef{"ns", "c"})
			must(t, err)
			if info.Layout != LayoutSnapshot || len(info.Layers) != 1 || info.Bytes != res.Bytes {
				t.Errorf("Inspect = %+v, want the snapshot layout, one generation of %d bytes", info, res.Bytes)
			}
			w := mountSnapshot(t, s, "b", "ns/c", MountOptions{UID: 3000, GID: 3000, Mode: 0o770})
			if got := readFile(t, filepath.Join(w.MergedPath, "dir", "f")); got != "1" {
				t.Errorf("remount shows %q, want 1", got)
			}
			must(t, unix.Stat(w.MergedPath, &st))
			if st.Uid != 3000 || st.Gid != 3000 || st.Mode&0o7777 != 0o770 {
				t.Errorf("a volume of an existing cache has root %o %d:%d, want 0770 3000:3000 as asked", st.Mode, st.Uid, st.Gid)
			}
			r, err := s.readVolume("b")
			must(t, err)
			if changed, err := (snapshotLayout{s}).changed(r); err != nil || changed {
				t.Errorf("a volume only mounted has changes = %v, %v; want false", changed, err)
			}
			gens, vols := subvolumes(t, s)
			if len(gens) != 1 || len(vols) != 1 {
				t.Errorf("subvolumes: generations %v, volumes %v; want one of each", gens, vols)
			}
			must(t, s.Discard(ctx, "b"))
			if _, vols := subvolumes(t, s); len(vols) != 0 {
				t.Errorf("volume subvolumes after discard: %v", vols)
			}
			assertNoOrphans(t, s)
		})
	}
}

// Snapshot volumes follow overlay's rules (issue 8, item 3): nosuid and
// nodev unless lifted, at mount and at remount.
func TestSnapshotVolumeFlags(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	for _, tt := range []struct {
		id                 string
		opts               MountOptions
		wantFlags, wantNot int64
	}{
		{"plain", MountOptions{}, unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOATIME, 0},
		{"lifted", MountOptions{AllowSetuid: true, AllowDevices: true}, unix.ST_NOATIME, unix.ST_NOSUID | unix.ST_NODEV},
	} {
		v := mountSnapshot(t, s, tt.id, "ns/"+tt.id, tt.opts)
		check := func(when string) {
			var st unix.Statfs_t
			must(t, unix.Statfs(v.MergedPath, &st))
			if st.Flags&tt.wantFlags != tt.wantFlags || st.Flags&tt.wantNot != 0 {
				t.Errorf("%s %s: mount flags %#x, want %#x set and %#x clear", tt.id, when, st.Flags, tt.wantFlags, tt.wantNot)
			}
		}
		check("mount")
		must(t, unix.Unmount(v.MergedPath, 0))
		if _, err := s.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		check("remount")
		cmd, err := s.MountCommand(ctx, tt.id)
		if err != nil || !strings.Contains(cmd, "mount --bind "+s.snapshots.VolumePath(tt.id)) {
			t.Errorf("MountCommand = %q, %v; want a bind mount of the subvolume", cmd, err)
		}
	}
}

func TestSnapshotTwoWritersLastWins(t *testing.T) {
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "base", "ns/c", map[string]string{"kept": "0"})
	a := mountSnapshot(t, s, "a", "ns/c", MountOptions{})
	b := mountSnapshot(t, s, "b", "ns/c", MountOptions{})
	writeFile(t, filepath.Join(a.MergedPath, "x"), "a")
	writeFile(t, filepath.Join(a.MergedPath, "only-a"), "a")
	writeFile(t, filepath.Join(b.MergedPath, "x"), "b")
	mustCommit(t, s, "a")
	if res := mustCommit(t, s, "b"); res.Generation != 3 {
		t.Errorf("second Commit = %+v, want generation 3", res)
	}
	got := view(t, s, "ns/c")
	if _, ok := got["only-a"]; ok {
		t.Error("the earlier writer's file survived: want whole-volume last writer wins")
	}
	if _, ok := got["x"]; !ok || len(got) != 3 { // ".", kept, x
		t.Errorf("cache shows %v, want kept and x", got)
	}
	if gens, _ := subvolumes(t, s); len(gens) != 1 {
		t.Errorf("generations %v, want only the head", gens)
	}
	assertNoOrphans(t, s)
}

func TestSnapshotReadOnlyNeverCommits(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "base", "ns/c", map[string]string{"f": "1"})
	v := mountSnapshot(t, s, "r", "ns/c", MountOptions{ReadOnly: true})
	writeFile(t, filepath.Join(v.MergedPath, "f"), "2")
	if _, err := s.Commit(ctx, "r"); err == nil {
		t.Fatal("Commit of a read-only snapshot volume succeeded")
	}
	must(t, s.Discard(ctx, "r"))
	if got := view(t, s, "ns/c")["f"]; !strings.Contains(got, "size=1 ") {
		t.Errorf("cache's f is %s after a read-only volume wrote it", got)
	}
	assertNoOrphans(t, s)
}

func TestSnapshotLimit(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "base", "ns/c", map[string]string{"f": "1"})
	before := view(t, s, "ns/c")
	v := mountSnapshot(t, s, "v", "ns/c", MountOptions{LimitBytes: 8 << 20})
	err := writeBytes(filepath.Join(v.MergedPath, "big"), 64<<20)
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("writing 64 MiB into a volume limited to 8 MiB: %v, want EDQUOT", err)
	}
	must(t, s.Discard(ctx, "v"))

	// A volume over its limit at commit (its limit lowered after the
	// writes) is discarded, and the cache stays as it was.
	w := mountSnapshot(t, s, "w", "ns/c", MountOptions{LimitBytes: 64 << 20})
	must(t, writeBytes(filepath.Join(w.MergedPath, "mid"), 4<<20))
	must(t, s.transact(ctx, scope{volume: "w"}, func(t *txn) error { t.Volume.LimitBytes = 1 << 20; return nil }))
	res := mustCommit(t, s, "w")
	if !res.OverLimit || res.Generation != 1 || res.Layer != "" {
		t.Errorf("Commit over the limit = %+v, want OverLimit at generation 1", res)
	}
	if d := diffSnapshots(before, view(t, s, "ns/c")); d != "" {
		t.Errorf("cache changed by volumes over their limit:\n%s", d)
	}
	assertNoOrphans(t, s)
}

// writeBytes writes n bytes to a new file and fsyncs it: qgroup limits
// may refuse at write or at writeback.
func writeBytes(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i) // not zeros: nothing may compress them away
	}
	for written := 0; written < n; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			return err
		}
	}
	return f.Sync()
}

func TestLayoutMismatch(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	mustMount(t, s, "o", "ns/over")
	mountSnapshot(t, s, "n", "ns/snap", MountOptions{})
	for _, tt := range []struct {
		cache  string
		layout Layout
		has    Layout
	}{{"ns/over", LayoutSnapshot, LayoutOverlay}, {"ns/snap", LayoutOverlay, LayoutSnapshot}, {"ns/snap", "", LayoutSnapshot}} {
		_, err := s.Mount(ctx, "x", MountOptions{Cache: mustRef(t, tt.cache), Layout: tt.layout})
		if !errors.Is(err, ErrLayoutMismatch) || !strings.Contains(err.Error(), string(tt.has)) || !strings.Contains(err.Error(), string(tt.layout.orDefault())) {
			t.Errorf("Mount of %s (%s) with layout %q: %v; want ErrLayoutMismatch naming both", tt.cache, tt.has, tt.layout, err)
		}
	}
	if _, err := s.Volume(ctx, "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused mount left volume x: %v", err)
	}
}

// TestSnapshotSquashIsNoop: a snapshot cache has one generation, so
// there is nothing to squash.
func TestSnapshotSquashIsNoop(t *testing.T) {
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "a", "ns/c", map[string]string{"f": "1"})
	if sq, err := s.Squash(context.Background(), CacheRef{"ns", "c"}, 1); err != nil || sq.Squashed {
		t.Errorf("Squash = %+v, %v; want a no-op", sq, err)
	}
}

func TestSnapshotRemoveAndGC(t *testing.T) {
	for _, kind := range snapshotRoots {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			s := newSnapshotStore(t, kind)
			buildSnapshot(t, s, "a", "ns/gone", map[string]string{"f": "1"})
			buildSnapshot(t, s, "b", "ns/old", map[string]string{"f": "1"})
			gone := headGeneration(t, s, "ns/gone")
			must(t, s.Remove(ctx, mustRef(t, "ns/gone")))
			res, err := s.GC(ctx, GCOptions{MaxBytes: 1})
			must(t, err)
			if len(res.RemovedCaches) != 1 || res.RemovedCaches[0] != mustRef(t, "ns/old") {
				t.Errorf("GC removed %v, want ns/old", res.RemovedCaches)
			}
			if gens, vols := subvolumes(t, s); len(gens)+len(vols) != 0 {
				t.Errorf("subvolumes left: %v %v", gens, vols)
			}
			assertQgroupsGone(t, s, gone)
			assertNoOrphans(t, s)
		})
	}
}

// headGeneration is the subvolume id of cache's head generation.
func headGeneration(t testing.TB, s *Store, cache string) uint64 {
	t.Helper()
	h, err := s.readHead(mustRef(t, cache))
	must(t, err)
	id, err := s.snapshots.GenerationID(h.Layers[0].ID)
	must(t, err)
	return id
}

// assertQgroupsGone waits for the kernel to free deleted subvolumes and
// checks that the sweep removes their qgroups.
func assertQgroupsGone(t testing.TB, s *Store, ids ...uint64) {
	t.Helper()
	// BTRFS_IOC_SYNC wakes the cleaner, which frees deleted subvolumes
	// (else it waits for the next periodic commit, 30 s); `btrfs
	// subvolume sync` waits until it has.
	run(t, "btrfs", "filesystem", "sync", s.snapshots.Dir())
	run(t, "btrfs", "subvolume", "sync", s.snapshots.Dir())
	_, err := s.GC(context.Background(), GCOptions{})
	must(t, err)
	all, err := s.snapshots.QgroupIDs()
	must(t, err)
	for _, q := range all {
		for _, id := range ids {
			if q == id {
				t.Errorf("qgroup 0/%d of a deleted subvolume is left", id)
			}
		}
	}
}

// After a reboot, a snapshot volume that was mounted is torn, as overlay
// volumes are (one rule for both layouts): remounted with the cache as it
// is, and never committed.
func TestSnapshotTornAfterReboot(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "base", "ns/c", map[string]string{"f": "1"})
	before := view(t, s, "ns/c")
	v := mountSnapshot(t, s, "v", "ns/c", MountOptions{})
	writeFile(t, filepath.Join(v.MergedPath, "half"), "written before the crash")
	// A reboot: the mount is gone and the record is of another boot.
	must(t, unix.Unmount(v.MergedPath, 0))
	must(t, s.transact(ctx, scope{volume: "v"}, func(t *txn) error { t.Volume.BootID = "an-earlier-boot"; return nil }))
	res, err := s.Recover(ctx)
	must(t, err)
	if len(res.Torn) != 1 || res.Torn[0] != "v" {
		t.Errorf("Recover = %+v, want volume v torn", res)
	}
	got, err := s.Volume(ctx, "v")
	must(t, err)
	if !got.Torn || !got.Mounted {
		t.Errorf("Volume = %+v, want torn and mounted", got)
	}
	assertMissing(t, filepath.Join(got.MergedPath, "half"))
	if c := mustCommit(t, s, "v"); !c.Torn || c.Generation != 1 {
		t.Errorf("Commit of a torn volume = %+v, want torn at generation 1", c)
	}
	if d := diffSnapshots(before, view(t, s, "ns/c")); d != "" {
		t.Errorf("a torn volume changed the cache:\n%s", d)
	}
	assertNoOrphans(t, s)
}

// Without mkfs.btrfs a snapshot mount on a root that is not btrfs fails
// saying what was tried and what to install; overlay caches still work.
func TestSnapshotWithoutMkfs(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{MkfsBtrfs: "/nonexistent/mkfs.btrfs", SnapshotImageBytes: testImageBytes})
	_, err := s.Mount(ctx, "v", MountOptions{Cache: mustRef(t, "ns/c"), Layout: LayoutSnapshot})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/mkfs.btrfs") || !strings.Contains(err.Error(), "btrfs-progs") {
		t.Fatalf("Mount without mkfs.btrfs: %v; want an error naming the program and the package", err)
	}
	if _, err := s.Inspect(ctx, mustRef(t, "ns/c")); !errors.Is(err, ErrNotFound) {
		t.Errorf("a failed snapshot mount left cache ns/c: %v", err)
	}
	assertMissing(t, s.snapshots.Image())
	mustMount(t, s, "o", "ns/o")
	assertNoOrphans(t, s)
}

// A snapshot cache's size follows what its generation holds: it grows
// with a build's writes and shrinks once a later build deleted them.
func TestSnapshotBytes(t *testing.T) {
	s := newSnapshotStore(t, "image")
	v := mountSnapshot(t, s, "a", "ns/c", MountOptions{})
	must(t, writeBytes(filepath.Join(v.MergedPath, "big"), 8<<20))
	grown := mustCommit(t, s, "a").Bytes
	if grown < 8<<20 || grown > 10<<20 {
		t.Fatalf("cache with an 8 MiB file takes %d bytes", grown)
	}
	w := mountSnapshot(t, s, "b", "ns/c", MountOptions{})
	must(t, os.Remove(filepath.Join(w.MergedPath, "big")))
	writeFile(t, filepath.Join(w.MergedPath, "small"), "x")
	mustCommit(t, s, "b")
	// The kernel frees the replaced generation in the background; the
	// next commit counts what is left.
	run(t, "btrfs", "filesystem", "sync", s.snapshots.Dir())
	run(t, "btrfs", "subvolume", "sync", s.snapshots.Dir())
	buildSnapshot(t, s, "c", "ns/c", map[string]string{"other": "y"})
	info, err := s.Inspect(context.Background(), mustRef(t, "ns/c"))
	must(t, err)
	if info.Bytes >= 1<<20 {
		t.Errorf("cache without the 8 MiB file still takes %d bytes", info.Bytes)
	}
}

// After the image's mount is gone (a reboot, or the node agent's
// container restarted without it), Open mounts the image again and
// Recover remounts the volumes; a second Open changes nothing.
func TestSnapshotImageRemountedAtOpen(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "base", "ns/c", map[string]string{"f": "1"})
	v := mountSnapshot(t, s, "v", "ns/c", MountOptions{})
	writeFile(t, filepath.Join(v.MergedPath, "g"), "2")
	must(t, unmountAll(s.Root()))
	if ondisk.FSTypeName(s.snapshots.Dir()) == "btrfs" {
		t.Fatal("the image is still mounted")
	}
	for range 2 {
		again, err := Open(ctx, Options{Root: s.Root()})
		must(t, err)
		if _, err := again.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, filepath.Join(v.MergedPath, "g")); got != "2" {
			t.Errorf("remounted volume shows g = %q, want 2", got)
		}
		s = again
	}
	mustCommit(t, s, "v")
	if got := view(t, s, "ns/c"); len(got) != 3 {
		t.Errorf("cache shows %v, want f and g", got)
	}
	assertNoOrphans(t, s)
}

// TestDamagedSnapshotImageSparesOverlay: a snapshot image that cannot be
// mounted again does not take the store down. Open succeeds and overlay
// caches work; a snapshot mount fails naming the image.
func TestDamagedSnapshotImageSparesOverlay(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "base", "ns/snap", map[string]string{"f": "1"})
	must(t, unmountAll(s.Root()))
	// Zero the superblock (64 KiB in): the kernel no longer sees btrfs.
	f, err := os.OpenFile(s.snapshots.Image(), os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt(make([]byte, 4096), 64<<10)
	must(t, errors.Join(err, f.Close()))

	again, err := Open(ctx, Options{Root: s.Root()})
	if err != nil {
		t.Fatalf("Open with a damaged snapshot image: %v; want the store open for overlay caches", err)
	}
	merged := mustMount(t, again, "overlay", "ns/plain")
	writeFile(t, filepath.Join(merged, "f"), "ok")
	mustCommit(t, again, "overlay")
	_, err = again.Mount(ctx, "snap", MountOptions{Cache: CacheRef{"ns", "snap"}, Layout: LayoutSnapshot})
	if err == nil || !strings.Contains(err.Error(), s.snapshots.Image()) {
		t.Errorf("snapshot mount on a damaged image: %v, want an error naming %s", err, s.snapshots.Image())
	}
}

// TestSnapshotImageShortOfSpace: free-space eviction measures the btrfs
// image for snapshot caches, not the host's filesystem: a full image loses
// its least recently used snapshot cache while overlay caches, on a host
// with room, stay.
func TestSnapshotImageShortOfSpace(t *testing.T) {
	ctx := context.Background()
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "old", "ns/old", map[string]string{"f": "1"})
	v := mountSnapshot(t, s, "big", "ns/big", MountOptions{})
	must(t, writeBytes(filepath.Join(v.MergedPath, "blob"), 400<<20))
	mustCommit(t, s, "big")
	merged := mustMount(t, s, "overlay", "ns/plain")
	writeFile(t, filepath.Join(merged, "f"), "1")
	mustCommit(t, s, "overlay")

	var image, host unix.Statfs_t
	must(t, unix.Statfs(s.snapshots.Dir(), &image))
	must(t, unix.Statfs(s.Root(), &host))
	imageFree, hostFree := int64(image.Bavail)*image.Bsize, int64(host.Bavail)*host.Bsize
	if imageFree >= hostFree || imageFree > testImageBytes-(400<<20) {
		t.Fatalf("the image has %d bytes free and the host %d: the test needs a fuller image than host", imageFree, hostFree)
	}
	// More free than the image has, far less than the host has.
	res, err := s.GC(ctx, GCOptions{MinFreeBytes: imageFree + 300<<20})
	must(t, err)
	if len(res.RemovedCaches) == 0 || res.RemovedCaches[0] != mustRef(t, "ns/old") {
		t.Errorf("GC removed %v, want the least recently used snapshot cache ns/old first", res.RemovedCaches)
	}
	if slices.Contains(res.RemovedCaches, mustRef(t, "ns/plain")) {
		t.Errorf("GC removed the overlay cache ns/plain though the host has %d bytes free", hostFree)
	}
	if got := view(t, s, "ns/plain"); got["f"] == "" {
		t.Errorf("overlay cache shows %v after GC, want its file f", got)
	}
	t.Logf("GC on an image with %d MiB free (want %d MiB): removed %v", imageFree>>20, (imageFree+300<<20)>>20, res.RemovedCaches)
	assertNoOrphans(t, s)
}
