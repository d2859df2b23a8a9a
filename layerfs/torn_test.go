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

// Issue 8, item 8: a volatile overlay's upper layer may be torn after a
// crash (the kernel marks its work directory with incompat/volatile), but
// remount reset the work directory, erasing the marker, and the torn upper
// was later committed into the cache. The store now detects it first,
// records it, empties the upper layer, and Commit discards the volume and
// says so.
func TestVolatileMarkerClearedAtRemount(t *testing.T) {
	tests := []struct {
		name     string
		reboot   bool // the volume's recorded boot is not the running one
		wantTorn bool
	}{
		{"crash: marker from another boot", true, true},
		{"unmounted in this boot: data intact", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := newTestStore(t, Options{})
			merged := mustMount(t, s, "v", "ns/c")
			writeFile(t, filepath.Join(merged, "half-written"), "?")
			must(t, unix.Unmount(merged, 0))
			// As the kernel leaves it (it does so on a clean unmount too).
			must(t, os.MkdirAll(overlayLayout{s}.volatileMarker("v"), 0o700))
			if tt.reboot {
				r, err := s.readVolume("v")
				must(t, err)
				r.BootID = "an-earlier-boot"
				must(t, ondisk.WriteJSONAtomic(s.volumePath("v"), r))
			}
			res, err := s.Recover(ctx)
			must(t, err)
			if got := len(res.Torn) == 1 && res.Torn[0] == "v"; got != tt.wantTorn {
				t.Errorf("Recover reported torn %v, want torn=%v", res.Torn, tt.wantTorn)
			}
			v, err := s.Volume(ctx, "v")
			must(t, err)
			if v.Torn != tt.wantTorn || !v.Mounted {
				t.Errorf("volume after remount: torn=%v mounted=%v, want torn=%v, mounted", v.Torn, v.Mounted, tt.wantTorn)
			}
			_, statErr := os.Stat(filepath.Join(merged, "half-written"))
			if visible := statErr == nil; visible == tt.wantTorn {
				t.Errorf("the upper layer's file visible=%v after remount, want %v", visible, !tt.wantTorn)
			}
			writeFile(t, filepath.Join(merged, "after-remount"), "x")
			cres := mustCommit(t, s, "v")
			if cres.Torn != tt.wantTorn || (cres.Layer == "") != tt.wantTorn {
				t.Errorf("Commit = %+v, want torn=%v and a layer only if not torn", cres, tt.wantTorn)
			}
			if _, err := s.Volume(ctx, "v"); !errors.Is(err, ErrNotFound) {
				t.Errorf("volume after commit: %v, want it gone", err)
			}
			snap := view(t, s, "ns/c")
			if _, ok := snap["half-written"]; ok == tt.wantTorn {
				t.Errorf("cache has half-written=%v, want %v", ok, !tt.wantTorn)
			}
			assertNoOrphans(t, s)
		})
	}
}

// A commit interrupted after it sealed the upper layer had synced it, so
// remounting it after a reboot must not take it for torn.
func TestRolledBackCommitAfterRebootIsNotTorn(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	merged := mustMount(t, s, "v", "ns/c")
	writeFile(t, filepath.Join(merged, "synced"), "x")
	r, err := s.readVolume("v")
	must(t, err)
	_, err = overlayLayout{s}.seal(r) // unmounts, syncs
	must(t, err)
	r.BootID = "an-earlier-boot"
	must(t, ondisk.WriteJSONAtomic(s.volumePath("v"), r))
	v, err := s.Mount(ctx, "v", MountOptions{Cache: mustRef(t, "ns/c")})
	must(t, err)
	if v.Torn || readFile(t, filepath.Join(merged, "synced")) != "x" {
		t.Fatalf("rolled-back volume torn=%v; want its synced data kept", v.Torn)
	}
	if res := mustCommit(t, s, "v"); res.Torn || res.Layer == "" {
		t.Fatalf("Commit = %+v, want a layer", res)
	}
}
