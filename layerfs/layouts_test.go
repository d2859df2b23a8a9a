package layerfs

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Every layout keeps the volumeLayout contract, as every containerd
// snapshotter keeps its testsuite's: the same cases run against each.
// storetest checks the store that composes them; these check what the
// store relies on each layout for.
func TestLayoutContract(t *testing.T) {
	for _, l := range []struct {
		layout   Layout
		newStore func(t testing.TB) *Store
	}{
		{LayoutOverlay, func(t testing.TB) *Store { return newTestStore(t, Options{}) }},
		{LayoutSnapshot, func(t testing.TB) *Store { return newSnapshotStore(t, "image") }},
	} {
		t.Run(string(l.layout), func(t *testing.T) {
			for _, c := range layoutCases {
				t.Run(c.name, func(t *testing.T) {
					s := l.newStore(t)
					c.run(t, &layoutRun{s: s, l: s.layoutOf(l.layout), layout: l.layout})
				})
			}
		})
	}
}

var layoutCases = []struct {
	name string
	run  func(t *testing.T, r *layoutRun)
}{
	{"a new volume is mounted and unchanged; its build writes to upperDir", func(t *testing.T, r *layoutRun) {
		v := r.create(t, "v")
		if !ondisk.IsMountPoint(v.MergedPath) {
			t.Fatalf("%s is not mounted after create", v.MergedPath)
		}
		r.expectChanged(t, v, false)
		writeFile(t, filepath.Join(v.MergedPath, "f"), "1")
		if got := readFile(t, filepath.Join(r.l.upperDir(v), "f")); got != "1" {
			t.Errorf("upperDir holds %q, want what the build wrote", got)
		}
	}},
	{"the control directory is no change", func(t *testing.T, r *layoutRun) {
		v := r.create(t, "v")
		writeFile(t, filepath.Join(v.MergedPath, ControlDir, "commit"), "")
		r.expectChanged(t, v, false)
		writeFile(t, filepath.Join(v.MergedPath, "f"), "1")
		r.expectChanged(t, v, true)
	}},
	{"seal of an unchanged volume unmounts it and makes no layer", func(t *testing.T, r *layoutRun) {
		v := r.create(t, "v")
		layer, err := r.l.seal(v)
		must(t, err)
		if layer != nil {
			t.Errorf("seal = %+v, want no layer", layer)
		}
		if ondisk.IsMountPoint(v.MergedPath) {
			t.Error("still mounted after seal")
		}
	}},
	{"seal makes the volume's layer and moves the control directory aside", func(t *testing.T, r *layoutRun) {
		v := r.create(t, "v")
		writeFile(t, filepath.Join(v.MergedPath, "f"), strings.Repeat("x", 4096))
		writeFile(t, filepath.Join(v.MergedPath, ControlDir, "commit"), "")
		layer, err := r.l.seal(v)
		must(t, err)
		if layer == nil || layer.ID != v.Upper || layer.Bytes <= 0 {
			t.Fatalf("seal = %+v, want layer %s with its bytes", layer, v.Upper)
		}
		if ondisk.Exists(filepath.Join(r.l.upperDir(v), ControlDir)) {
			t.Error("the control directory is inside the sealed layer")
		}
		if !ondisk.Exists(filepath.Join(r.s.controlAside(v.ID), "commit")) {
			t.Error("the control directory was not moved aside")
		}
	}},
	{"remount shows what the build wrote", func(t *testing.T, r *layoutRun) {
		v := r.create(t, "v")
		writeFile(t, filepath.Join(v.MergedPath, "f"), "1")
		must(t, ondisk.Unmount(v.MergedPath))
		must(t, r.s.transact(context.Background(), scope{store: true, volume: "v"}, r.l.remount))
		if got := readFile(t, filepath.Join(v.MergedPath, "f")); got != "1" {
			t.Errorf("after remount f = %q, want 1", got)
		}
	}},
	{"a pushed layer is the head's newest", func(t *testing.T, r *layoutRun) {
		v := r.create(t, "v")
		h := &head{Cache: v.Cache}
		r.l.push(h, LayerInfo{ID: "l1"}, v)
		r.l.push(h, LayerInfo{ID: "l2"}, v)
		if h.Generation != 2 || h.Layers[0].ID != "l2" {
			t.Errorf("head after two pushes: generation %d, layers %v; want 2 with l2 newest", h.Generation, h.layerIDs())
		}
	}},
	{"an ended volume leaves nothing the sweep keeps", func(t *testing.T, r *layoutRun) {
		v := r.create(t, "v")
		writeFile(t, filepath.Join(v.MergedPath, "f"), "1")
		must(t, r.s.Discard(context.Background(), "v"))
		_, err := r.l.sweep(context.Background())
		must(t, err)
		if ondisk.Exists(r.l.upperDir(v)) {
			t.Errorf("%s is left after the volume ended", r.l.upperDir(v))
		}
	}},
	{"the mount command names the mount point", func(t *testing.T, r *layoutRun) {
		v := r.create(t, "v")
		if cmd := r.l.mountCommand(v); !strings.Contains(cmd, v.MergedPath) {
			t.Errorf("mount command %q does not name %s", cmd, v.MergedPath)
		}
	}},
}

// layoutRun is one case's store and the layout under test.
type layoutRun struct {
	s      *Store
	l      volumeLayout
	layout Layout
}

// create makes volume id of cache ns/c with the layout under test.
func (r *layoutRun) create(t *testing.T, id string) *volumeRecord {
	t.Helper()
	opts := MountOptions{Cache: mustRef(t, "ns/c"), Layout: r.layout, Mode: 0o777}
	var v *volumeRecord
	must(t, r.s.transact(context.Background(), scope{store: true, volume: id, cache: opts.Cache}, func(tx *txn) error {
		if err := r.l.create(tx, id, opts); err != nil {
			return err
		}
		v = tx.Volume
		return nil
	}))
	return v
}

func (r *layoutRun) expectChanged(t *testing.T, v *volumeRecord, want bool) {
	t.Helper()
	changed, err := r.l.changed(v)
	must(t, err)
	if changed != want {
		t.Errorf("changed = %v, want %v", changed, want)
	}
}
