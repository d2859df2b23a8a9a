package layerfs

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"testing"
)

func TestControlFiles(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		write  func(t *testing.T, merged string)
		commit bool // the build wrote the commit marker
		layer  bool // the commit adds a layer
	}{
		{name: "none", write: func(t *testing.T, m string) { writeFile(t, filepath.Join(m, "f"), "x") }, layer: true},
		{name: "marker only", write: func(t *testing.T, m string) { writeFile(t, filepath.Join(m, ControlDir, "commit"), "") }, commit: true},
		{name: "marker and data", write: func(t *testing.T, m string) {
			writeFile(t, filepath.Join(m, "f"), "x")
			writeFile(t, filepath.Join(m, ControlDir, "commit"), "")
		}, commit: true, layer: true},
		{name: "marker is a directory", write: func(t *testing.T, m string) {
			must(t, os.MkdirAll(filepath.Join(m, ControlDir, "commit"), 0o755))
		}},
		{name: "control dir is a symlink", write: func(t *testing.T, m string) {
			writeFile(t, filepath.Join(m, "elsewhere", "commit"), "")
			must(t, os.Symlink("elsewhere", filepath.Join(m, ControlDir)))
		}, layer: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, Options{})
			tc.write(t, mustMount(t, s, "v1", "ns/c"))
			end, err := s.End(ctx, "v1", EndOptions{ControlFiles: []string{"commit", "abort"}})
			must(t, err)
			if want := map[string]bool{"commit": tc.commit, "abort": false}; !maps.Equal(end.Written, want) {
				t.Errorf("End read control files %v, want %v", end.Written, want)
			}
			if res := end.Commit; !end.Kept || (res.Layer != "") != tc.layer {
				t.Errorf("End = %+v, want a commit with a layer: %v", end, tc.layer)
			}
			if _, ok := view(t, s, "ns/c")[ControlDir]; ok {
				t.Errorf("the control directory landed in the cache")
			}
		})
	}
}

func TestControlFileBadNamesAreRefused(t *testing.T) {
	s := newTestStore(t, Options{})
	mustMount(t, s, "v1", "ns/c")
	for _, name := range []string{"../../etc", "a/b", ""} {
		if res, err := s.End(context.Background(), "v1", EndOptions{ControlFiles: []string{name}}); err == nil {
			t.Errorf("End asking about %q = %+v, want an error", name, res)
		}
	}
	if _, err := s.Volume(context.Background(), "v1"); err != nil {
		t.Errorf("the volume after Ends that were refused: %v", err)
	}
}

// Issue 8, item 2: without project quotas, a volume's size limit (its
// claim's request) is enforced at commit: changes larger than the limit
// are discarded, and the cache stays as it was.
func TestCommitOverLimitDiscards(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name      string
		limit     int64
		write     int
		overLimit bool
	}{
		{"no limit", 0, 1 << 20, false},
		{"within the limit", 2 << 20, 1 << 20, false},
		{"over the limit", 256 << 10, 1 << 20, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, Options{})
			v, err := s.Mount(ctx, "v1", MountOptions{Cache: CacheRef{"ns", "c"}, LimitBytes: tc.limit})
			must(t, err)
			must(t, os.WriteFile(filepath.Join(v.MergedPath, "big"), make([]byte, tc.write), 0o644))
			res := mustCommit(t, s, "v1")
			if res.OverLimit != tc.overLimit {
				t.Fatalf("commit = %+v, want OverLimit %v", res, tc.overLimit)
			}
			info, err := s.Inspect(ctx, CacheRef{"ns", "c"})
			must(t, err)
			if tc.overLimit && (info.Generation != 0 || res.Bytes < int64(tc.write)) {
				t.Errorf("over the limit: cache at generation %d, commit reported %d bytes; want generation 0 and the upper's size", info.Generation, res.Bytes)
			}
			if _, err := s.Volume(ctx, "v1"); err == nil {
				t.Errorf("the volume is still there after its commit")
			}
			assertNoOrphans(t, s)
		})
	}
	if err := (MountOptions{Cache: CacheRef{"ns", "c"}, LimitBytes: -1}).Validate(); err == nil {
		t.Errorf("a negative limit was accepted")
	}
}

// A commit interrupted after it moved the control directory out of the
// upper layer (a crash) keeps the markers that decided it: the agent
// still finds them after a restart, and they never land in the cache.
func TestControlFilesSurviveAnInterruptedCommit(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	merged := mustMount(t, s, "v", "ns/c")
	writeFile(t, filepath.Join(merged, "f"), "x")
	writeFile(t, filepath.Join(merged, ControlDir, "commit"), "")
	r, err := s.readVolume("v")
	must(t, err)
	_, err = overlayLayout{s}.seal(r) // where a crash could stop the commit
	must(t, err)
	if _, err := s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"commit": true, "abort": false} {
		r, err := s.readVolume("v")
		must(t, err)
		if got, err := s.wroteControlFile(r, name); err != nil || got != want {
			t.Errorf("control file %s after the interrupted commit = %v, %v; want %v", name, got, err, want)
		}
	}
	mustCommit(t, s, "v")
	if _, ok := view(t, s, "ns/c")[ControlDir]; ok {
		t.Errorf("the control directory landed in the cache")
	}
}
