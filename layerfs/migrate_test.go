package layerfs

import (
	"context"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// toLegacy turns volume id into one of the store's old layout: its upper
// directory at volumes/<id>/upper and no Upper in its record. A mounted
// volume stays mounted, as the old layout mounted it.
func toLegacy(t testing.TB, s *Store, id string) *volumeRecord {
	t.Helper()
	r, err := s.readVolume(id)
	must(t, err)
	mounted := isMountPoint(r.MergedPath)
	if mounted {
		must(t, unix.Unmount(r.MergedPath, 0))
	}
	must(t, renameDurable(s.layerDir(r.Upper), s.legacyUpperDir(id)))
	r.Upper = ""
	must(t, writeJSONAtomic(s.volumePath(id), r))
	if mounted {
		must(t, resetDir(s.workDir(id)))
		must(t, s.volumeSpec(r).mount(r.MergedPath))
	}
	return r
}

// setupLegacyCommit leaves a commit of the old layout after its intent was
// recorded: the volume unmounted, its record committing, its upper
// directory (with a commit marker) moved to layers/ or not.
func setupLegacyCommit(t testing.TB, s *Store, moved bool) {
	buildChain(t, s, "ns/c", layerSteps[:2])
	merged := mustMount(t, s, "pending", "ns/c")
	layerSteps[2](t, merged)
	writeFile(t, filepath.Join(merged, ControlDir, "commit"), "")
	fixTimes(t, merged)
	must(t, unix.Unmount(merged, 0))
	r := toLegacy(t, s, "pending")
	must(t, syncFS(s.legacyUpperDir("pending")))
	bytes, files, err := diskUsage(s.legacyUpperDir("pending"))
	must(t, err)
	r.State = legacyStateCommitting
	r.CommitLayer = &LayerInfo{ID: randomID(), Bytes: bytes, Files: files, Created: fixedTime}
	must(t, writeJSONAtomic(s.volumePath("pending"), r))
	if moved {
		must(t, stripControlDir(s.legacyUpperDir("pending")))
		must(t, renameDurable(s.legacyUpperDir("pending"), s.layerDir(r.CommitLayer.ID)))
	}
}

// A node agent upgraded while builds run finds their volumes mounted in
// the old layout. Recover moves their upper directories home without
// unmounting them; what the builds write next lands in the commit.
func TestRecoverMigratesLegacyVolumes(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		mounted bool
	}{
		{"mounted", true},
		{"unmounted", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestStore(t, Options{})
			merged := mustMount(t, s, "v", "ns/c")
			writeFile(t, filepath.Join(merged, "before"), "1")
			if !tt.mounted {
				must(t, unix.Unmount(merged, 0))
			}
			toLegacy(t, s, "v")
			if _, err := s.Commit(ctx, "v"); err == nil {
				t.Fatal("Commit of a volume of the old layout succeeded before Recover")
			}
			if _, err := s.Recover(ctx); err != nil {
				t.Fatal(err)
			}
			r, err := s.readVolume("v")
			must(t, err)
			if r.Upper == "" || !exists(s.layerDir(r.Upper)) || exists(s.legacyUpperDir("v")) {
				t.Fatalf("after Recover the volume's upper is %q (exists %v), legacy upper exists %v", r.Upper, exists(s.layerDir(r.Upper)), exists(s.legacyUpperDir("v")))
			}
			if !r.Mounted {
				t.Fatal("the volume is not mounted after Recover")
			}
			writeFile(t, filepath.Join(merged, "after"), "2")
			mustCommit(t, s, "v")
			got := view(t, s, "ns/c")
			for _, f := range []string{"before", "after"} {
				if _, ok := got[f]; !ok {
					t.Errorf("the commit lacks %s: %v", f, got)
				}
			}
			assertNoOrphans(t, s)
		})
	}
}
