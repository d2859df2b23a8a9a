package storetest

import (
	"errors"
	"io/fs"
	"maps"
	"testing"

	"github.com/layercache/layercache/layerfs"
)

// endControlFiles are the control files every End of the contract asks
// about: the commit marker, and one no build writes.
var endControlFiles = []string{commitMarker, "other"}

// onMarker keeps a volume's changes if its build wrote the commit
// marker, as the on-marker commit policy does.
func onMarker(written map[string]bool) bool { return written[commitMarker] }

// endCase is a build's end: what the build does in its volume, what
// Decide says, and what End must do.
type endCase struct {
	name     string
	readOnly bool
	build    func(t *testing.T, r *run, v *layerfs.Volume)
	decide   func(written map[string]bool) bool
	// marker: End reports the commit marker written; kept: it commits;
	// announced: BeforeSeal runs; layer: the commit adds one.
	marker, kept, announced, layer bool
}

// writes is a build that writes each of names (with content "1").
func writes(names ...string) func(t *testing.T, r *run, v *layerfs.Volume) {
	return func(t *testing.T, r *run, v *layerfs.Volume) {
		for _, name := range names {
			r.h.Write(t, v, name, "1")
		}
	}
}

// makesMarker is a build that writes f and makes the commit marker a
// node of kind, not a regular file.
func makesMarker(kind fs.FileMode) func(t *testing.T, r *run, v *layerfs.Volume) {
	return func(t *testing.T, r *run, v *layerfs.Volume) {
		r.h.Make(t, v, controlCommit, kind)
		r.h.Write(t, v, "f", "1")
	}
}

var endTable = []endCase{
	{name: "a regular marker is read and the changes kept", build: writes(controlCommit, "f"), decide: onMarker,
		marker: true, kept: true, announced: true, layer: true},
	{name: "without the marker the changes are discarded", build: writes("f"), decide: onMarker},
	{name: "a symlink is no marker", build: makesMarker(fs.ModeSymlink), decide: onMarker},
	{name: "a directory is no marker", build: makesMarker(fs.ModeDir), decide: onMarker},
	{name: "a volume with only the marker commits without announcing", build: writes(controlCommit), decide: onMarker,
		marker: true, kept: true},
	{name: "no decide keeps the changes", build: writes("f"), kept: true, announced: true, layer: true},
	{name: "a read-only volume is discarded whatever decide says", readOnly: true,
		decide: func(map[string]bool) bool { return true }},
}

// endCases are the contract of End, one case of a fresh store per row
// of endTable.
func endCases() []testCase {
	var out []testCase
	for _, c := range endTable {
		out = append(out, testCase{"end: " + c.name, c.run})
	}
	return out
}

func (c endCase) run(t *testing.T, r *run) {
	v := r.mount(t, "v", layerfs.MountOptions{ReadOnly: c.readOnly})
	if c.build != nil {
		c.build(t, r, v)
	}
	announced := 0
	res, err := r.s.End(r.ctx, "v", layerfs.EndOptions{
		ControlFiles: endControlFiles,
		Decide:       c.decide,
		BeforeSeal: func() {
			announced++
			// The volume still shows what it is about to commit.
			if _, ok := r.readIfCan(t, v, "f"); !ok {
				t.Error("BeforeSeal ran once the volume no longer showed its changes")
			}
		},
	})
	if err != nil {
		t.Fatalf("End: %v", err)
	}
	written := map[string]bool{commitMarker: c.marker, "other": false}
	if res.Kept != c.kept || res.Announced != c.announced || announced != count(c.announced) || !maps.Equal(res.Written, written) {
		t.Errorf("End = %+v, BeforeSeal ran %d times; want kept %v, announced %v (once), written %v", res, announced, c.kept, c.announced, written)
	}
	c.expectEnded(t, r, res)
}

// expectEnded checks that End ended the volume as c says.
func (c endCase) expectEnded(t *testing.T, r *run, res layerfs.EndResult) {
	t.Helper()
	if got := res.Commit.Layer != ""; (c.kept && res.Commit.Cache != cacheC) || got != c.layer {
		t.Errorf("End's commit = %+v, want one of cache %s (kept %v) adding a layer: %v", res.Commit, cacheC, c.kept, c.layer)
	}
	info, err := r.s.Inspect(r.ctx, cacheC)
	if err != nil && !errors.Is(err, layerfs.ErrNotFound) {
		t.Fatalf("Inspect: %v", err)
	}
	if len(info.Layers) != count(c.layer) {
		t.Errorf("cache has %d layers after End, want %d", len(info.Layers), count(c.layer))
	}
	_, err = r.s.Volume(r.ctx, "v")
	expectNotFound(t, "Volume after End", err)
	_, err = r.s.End(r.ctx, "v", layerfs.EndOptions{ControlFiles: endControlFiles})
	expectNotFound(t, "End of an ended volume", err)
	if c.layer {
		r.expectShows(t, map[string]string{"f": "1"}, controlCommit)
	} else if !c.readOnly {
		r.expectShows(t, nil, "f", controlCommit)
	}
}

// end ends volume id with Decide, asking about endControlFiles.
func (r *run) end(t *testing.T, id string, decide func(map[string]bool) bool) layerfs.EndResult {
	t.Helper()
	res, err := r.s.End(r.ctx, id, layerfs.EndOptions{ControlFiles: endControlFiles, Decide: decide})
	if err != nil {
		t.Fatalf("End %s: %v", id, err)
	}
	return res
}

// readIfCan is Read, or a file that exists if the harness cannot read.
func (r *run) readIfCan(t *testing.T, v *layerfs.Volume, name string) (string, bool) {
	if r.h.Read == nil {
		return "", true
	}
	return r.h.Read(t, v, name)
}

func count(b bool) int {
	if b {
		return 1
	}
	return 0
}
