package layerfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/overlay"
)

func mustSync(t testing.TB, s *Store, cache string, chain Chain, fetch Fetch) SyncResult {
	t.Helper()
	res, err := s.Sync(context.Background(), mustRef(t, cache), chain, fetch, SyncOptions{})
	if err != nil {
		t.Fatalf("Sync(%s): %v", cache, err)
	}
	return res
}

// roundTripSteps add to layerSteps what only a tar can lose: a sparse
// file, an empty file and directory, a nanosecond mtime, a trusted xattr.
var roundTripSteps = append(slices.Clone(layerSteps), func(t testing.TB, d string) {
	f, err := os.Create(filepath.Join(d, "sparse"))
	must(t, err)
	must(t, f.Truncate(32<<20))
	_, err = f.WriteAt([]byte("end"), 32<<20-3)
	must(t, err)
	must(t, f.Close())
	writeFile(t, filepath.Join(d, "empty"), "")
	must(t, os.Mkdir(filepath.Join(d, "emptydir"), 0o711))
	must(t, unix.Setxattr(filepath.Join(d, "empty"), "trusted.app", []byte("v"), 0))
	must(t, os.Remove(filepath.Join(d, "keep.txt")))
})

func TestExportSyncRoundTrip(t *testing.T) {
	ctx := context.Background()
	a := newTestStore(t, Options{})
	buildChain(t, a, "ns/c", roundTripSteps)
	must(t, unix.UtimesNano(filepath.Join(a.layerDir(headIDs(t, a, "ns/c")[0]), "empty"),
		[]unix.Timespec{{Sec: 1, Nsec: 123456789}, {Sec: 1, Nsec: 123456789}}))
	want := view(t, a, "ns/c")
	if want["gone.txt"] == "" || want["replaced/old-1"] != "" || want["keep.txt"] != "" {
		t.Fatalf("fixture lacks the whiteouts and opaque dirs it should have: %v", want)
	}
	reg := registry{}
	chain := publish(t, a, reg, "ns/c")

	b := newTestStore(t, Options{})
	res := mustSync(t, b, "ns/c", chain, reg.fetch)
	if !res.Changed || res.Fetched != len(roundTripSteps) || res.Generation != chain.Generation || res.FetchedBytes <= 0 {
		t.Fatalf("Sync = %+v, want %d layers fetched at generation %d", res, len(roundTripSteps), chain.Generation)
	}
	if diff := diffSnapshots(want, view(t, b, "ns/c")); diff != "" {
		t.Fatalf("the synced cache differs from the original:\n%s", diff)
	}
	info, err := b.Inspect(ctx, mustRef(t, "ns/c"))
	must(t, err)
	for i, l := range info.Layers {
		if l.Digest != chain.Layers[i].Digest {
			t.Errorf("layer %d: digest %q, want %q", i, l.Digest, chain.Layers[i].Digest)
		}
	}
	// The store's own whiteout format, not the OCI one, lands on disk.
	top := b.layerDir(info.Layers[0].ID)
	if !overlay.IsWhiteout(filepath.Join(top, "keep.txt")) {
		t.Errorf("keep.txt in the pulled top layer is not an overlay whiteout")
	}
	assertMissing(t, filepath.Join(top, ".wh.keep.txt"))
	assertNoOrphans(t, b)

	// Deterministic: every export of a layer is the same blob. (A node
	// exports only layers it committed or squashed; a pulled one has its
	// digest. Through its image, a pulled sparse file shows its data at
	// the image's chunk size, so its export would differ.)
	for i, id := range headIDs(t, a, "ns/c") {
		var buf bytes.Buffer
		must(t, a.ExportLayer(ctx, mustRef(t, "ns/c"), id, &buf))
		if d := (registry{}).put(buf.Bytes()); d != chain.Layers[i].Digest {
			t.Errorf("layer %d exports as %s, first published as %s", i, d, chain.Layers[i].Digest)
		}
	}
}

// Two nodes commit on the same base at once; the sequencer orders B's
// layer after A's. Synced with that chain, both show the same view, B's
// change winning where both wrote, as on one node.
func TestConcurrentCommitsConverge(t *testing.T) {
	reg := registry{}
	a, b := newTestStore(t, Options{}), newTestStore(t, Options{})
	commitFiles(t, a, "ns/c", map[string]string{"base": "0", "both": "base"})
	base := publish(t, a, reg, "ns/c")
	mustSync(t, b, "ns/c", base, reg.fetch)

	commitFiles(t, a, "ns/c", map[string]string{"both": "from A", "a-only": "A"})
	commitFiles(t, b, "ns/c", map[string]string{"both": "from B", "b-only": "B"})
	dA := publish(t, a, reg, "ns/c").Layers[0].Digest
	dB := publish(t, b, reg, "ns/c").Layers[0].Digest
	chain := Chain{Generation: 3, Layers: []ChainLayer{{Digest: dB, Format: FormatEROFS}, {Digest: dA, Format: FormatEROFS}, base.Layers[0]}}

	for _, s := range []*Store{a, b} {
		res := mustSync(t, s, "ns/c", chain, reg.fetch)
		if !res.Changed || res.Fetched != 1 || res.Generation != 3 || res.Unpublished != 0 {
			t.Fatalf("%s: Sync = %+v, want 1 layer fetched at generation 3", s.Root(), res)
		}
	}
	va, vb := view(t, a, "ns/c"), view(t, b, "ns/c")
	if diff := diffSnapshots(va, vb); diff != "" {
		t.Fatalf("the nodes did not converge:\n%s", diff)
	}
	merged := mustMount(t, a, "check", "ns/c")
	for name, want := range map[string]string{"both": "from B", "a-only": "A", "b-only": "B", "base": "0"} {
		if got := readFile(t, filepath.Join(merged, name)); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

// commitFiles commits one layer with the given files.
func commitFiles(t testing.TB, s *Store, cache string, files map[string]string) CommitResult {
	t.Helper()
	id := "w-" + randomID()
	merged := mustMount(t, s, id, cache)
	ts := []unix.Timespec{unix.NsecToTimespec(fixedTime.UnixNano()), unix.NsecToTimespec(fixedTime.UnixNano())}
	for name, content := range files {
		// Only these files: touching others would copy them up into
		// the layer, as a build that touched them would.
		writeFile(t, filepath.Join(merged, name), content)
		must(t, unix.UtimesNano(filepath.Join(merged, name), ts))
	}
	return mustCommit(t, s, id)
}

func TestSyncKeepsUnpublishedLayersOnTop(t *testing.T) {
	ctx := context.Background()
	reg := registry{}
	a, b := newTestStore(t, Options{}), newTestStore(t, Options{})
	commitFiles(t, a, "ns/c", map[string]string{"f": "a1"})
	commitFiles(t, a, "ns/c", map[string]string{"f": "a2", "g": "a2"})
	chain := publish(t, a, reg, "ns/c")

	// A new cache; then the same chain again changes nothing.
	if res := mustSync(t, b, "ns/c", chain, reg.fetch); !res.Changed || res.Fetched != 2 || res.Generation != 2 {
		t.Fatalf("first Sync = %+v", res)
	}
	if res := mustSync(t, b, "ns/c", chain, reg.fetch); res.Changed || res.Fetched != 0 || res.Generation != 2 {
		t.Fatalf("second Sync = %+v, want no change", res)
	}

	// B's own commit stays on top of a newer chain; the generation
	// counts it above the chain's.
	commitFiles(t, b, "ns/c", map[string]string{"f": "b", "h": "b"})
	commitFiles(t, a, "ns/c", map[string]string{"f": "a3", "g": "a3"})
	chain = publish(t, a, reg, "ns/c")
	res := mustSync(t, b, "ns/c", chain, reg.fetch)
	if !res.Changed || res.Fetched != 1 || res.Unpublished != 1 || res.Generation != 4 {
		t.Fatalf("Sync over a local commit = %+v, want 1 fetched, 1 unpublished, generation 4", res)
	}
	merged := mustMount(t, b, "check", "ns/c")
	for name, want := range map[string]string{"f": "b", "g": "a3", "h": "b"} {
		if got := readFile(t, filepath.Join(merged, name)); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	info, err := b.Inspect(ctx, mustRef(t, "ns/c"))
	must(t, err)
	if info.Layers[0].Digest != "" || len(info.Layers) != 4 {
		t.Fatalf("head %+v, want the unpublished layer on top of 3", info.Layers)
	}

	// A stale read of the chain (generation 2, without A's third layer)
	// rolls nothing back.
	stale := Chain{Generation: 2, Layers: chain.Layers[1:]}
	if res := mustSync(t, b, "ns/c", stale, reg.fetch); res.Changed || res.Generation != 4 || res.Fetched != 0 || res.Unpublished != 1 {
		t.Fatalf("Sync with a stale chain = %+v, want no change at generation 4", res)
	}
	if h, err := b.readHead(mustRef(t, "ns/c")); err != nil || len(h.Layers) != 4 || h.Layers[1].Digest != chain.Layers[0].Digest {
		t.Fatalf("head after a stale Sync: %+v, %v; want A's third layer kept", h, err)
	}
	must(t, b.Discard(ctx, "check"))
	assertNoOrphans(t, b)
}

func TestPlanSync(t *testing.T) {
	d := func(n int) string { return fmt.Sprintf("sha256:%064d", n) }
	chain := func(ns ...int) []ChainLayer {
		var c []ChainLayer
		for _, n := range ns {
			c = append(c, ChainLayer{Digest: d(n)})
		}
		return c
	}
	ids := func(ls []LayerInfo) string {
		var s []string
		for _, l := range ls {
			s = append(s, l.ID)
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		name        string
		local       []LayerInfo
		chain       []ChainLayer
		wantLayers  string
		wantMissing []int
	}{
		{"empty", nil, nil, "", nil},
		{"all missing", nil, chain(2, 1), "", []int{0, 1}},
		{"unpublished on top", []LayerInfo{{ID: "u"}, {ID: "p1", Digest: d(1)}}, chain(2, 1), "u,p1", []int{0}},
		{"dropped from chain", []LayerInfo{{ID: "p3", Digest: d(3)}, {ID: "p1", Digest: d(1)}}, chain(1), "p1", nil},
		{"covers a run", []LayerInfo{{ID: "s", Covers: []string{d(2), d(1)}}}, chain(3, 2, 1), "s", []int{0}},
		{"covers no run", []LayerInfo{{ID: "s", Covers: []string{d(3), d(1)}}}, chain(3, 2, 1), "", []int{0, 1, 2}},
		{"longest match wins", []LayerInfo{{ID: "p2", Digest: d(2)}, {ID: "s", Covers: []string{d(2), d(1)}}}, chain(2, 1), "s", nil},
		{"a layer is used once", []LayerInfo{{ID: "p1", Digest: d(1)}}, chain(1, 1), "p1", []int{1}},
	} {
		p := planSync(tc.local, tc.chain, nil)
		if got := ids(p.layers); got != tc.wantLayers || !slices.Equal(p.missing, tc.wantMissing) {
			t.Errorf("%s: plan %q missing %v, want %q missing %v", tc.name, got, p.missing, tc.wantLayers, tc.wantMissing)
		}
	}
}

func TestSyncFailureChangesNothing(t *testing.T) {
	ctx := context.Background()
	reg := registry{}
	a, b := newTestStore(t, Options{}), newTestStore(t, Options{})
	for i := range 4 {
		commitFiles(t, a, "ns/c", map[string]string{fmt.Sprintf("f%d", i): "x"})
	}
	chain := publish(t, a, reg, "ns/c")
	commitFiles(t, b, "ns/c", map[string]string{"local": "b"})
	before := view(t, b, "ns/c")
	beforeHead, err := b.readHead(mustRef(t, "ns/c"))
	must(t, err)

	bad := chain.Layers[2].Digest
	for name, fetch := range map[string]Fetch{
		"fetch fails": func(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
			if l.Digest == bad {
				return nil, errors.New("registry unavailable")
			}
			return reg.fetch(ctx, l)
		},
		"digest mismatch": func(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
			if l.Digest == bad {
				return &verifyingReader{r: bytes.NewReader(reg[chain.Layers[1].Digest]), h: sha256.New(), want: bad}, nil
			}
			return reg.fetch(ctx, l)
		},
		"truncated": func(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
			if l.Digest == bad {
				return io.NopCloser(io.MultiReader(bytes.NewReader(reg[bad][:700]), iotestErr{})), nil
			}
			return reg.fetch(ctx, l)
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := b.Sync(ctx, mustRef(t, "ns/c"), chain, fetch, SyncOptions{Parallel: 2})
			if err == nil || !strings.Contains(err.Error(), bad) {
				t.Fatalf("Sync = %v, want an error that names layer %s", err, bad)
			}
			h, err := b.readHead(mustRef(t, "ns/c"))
			must(t, err)
			if !slices.EqualFunc(h.Layers, beforeHead.Layers, sameLayer) || h.Generation != beforeHead.Generation {
				t.Fatalf("a failed Sync changed the head: %+v", h)
			}
			if diff := diffSnapshots(before, view(t, b, "ns/c")); diff != "" {
				t.Fatalf("a failed Sync changed the view:\n%s", diff)
			}
			_, err = b.Recover(ctx)
			must(t, err)
			assertNoOrphans(t, b)
		})
	}
	if res := mustSync(t, b, "ns/c", chain, reg.fetch); res.Fetched != 4 || res.Unpublished != 1 {
		t.Fatalf("Sync after the failures = %+v, want 4 fetched, 1 unpublished", res)
	}
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// A squash of published layers stands for them: Sync fetches nothing, and
// a chain that publishes the squash replaces the covered layers.
func TestSquashOfPublishedLayersStaysPublished(t *testing.T) {
	ctx := context.Background()
	reg := registry{}
	a, b := newTestStore(t, Options{}), newTestStore(t, Options{})
	buildChain(t, a, "ns/c", layerSteps)
	chain := publish(t, a, reg, "ns/c")
	mustSync(t, b, "ns/c", chain, reg.fetch)
	commitFiles(t, b, "ns/c", map[string]string{"local": "b"})
	want := view(t, b, "ns/c")

	res, err := b.Squash(ctx, mustRef(t, "ns/c"), 1)
	must(t, err)
	if !res.Squashed || res.OldLayers != 3 {
		t.Fatalf("Squash = %+v, want the 3 published layers merged", res)
	}
	info, err := b.Inspect(ctx, mustRef(t, "ns/c"))
	must(t, err)
	var digests []string
	for _, l := range chain.Layers {
		digests = append(digests, l.Digest)
	}
	if len(info.Layers) != 2 || info.Layers[0].published() || !slices.Equal(info.Layers[1].Covers, digests) {
		t.Fatalf("head after squash %+v, want the local layer on one layer covering %v", info.Layers, digests)
	}
	if res := mustSync(t, b, "ns/c", chain, reg.fetch); res.Changed || res.Fetched != 0 {
		t.Fatalf("Sync after squash = %+v, want nothing fetched or changed", res)
	}
	if diff := diffSnapshots(want, view(t, b, "ns/c")); diff != "" {
		t.Fatalf("squash changed the view:\n%s", diff)
	}

	// A publishes its own squash: the chain becomes one layer, which A
	// has and B fetches, dropping its covering layer.
	_, err = a.Squash(ctx, mustRef(t, "ns/c"), 1)
	must(t, err)
	squashed := publish(t, a, reg, "ns/c")
	if res := mustSync(t, a, "ns/c", squashed, reg.fetch); res.Fetched != 0 {
		t.Fatalf("A's Sync of its own squash = %+v, want nothing fetched", res)
	}
	if res := mustSync(t, b, "ns/c", squashed, reg.fetch); res.Fetched != 1 || res.Unpublished != 1 {
		t.Fatalf("B's Sync of A's squash = %+v, want 1 fetched, 1 unpublished", res)
	}
	if diff := diffSnapshots(want, view(t, b, "ns/c")); diff != "" {
		t.Fatalf("syncing the published squash changed the view:\n%s", diff)
	}
	assertNoOrphans(t, b)
}

func TestSquashRun(t *testing.T) {
	pub := LayerInfo{ID: "p", Digest: "sha256:x"}
	cov := LayerInfo{ID: "c", Covers: []string{"sha256:y"}}
	loc := LayerInfo{ID: "l"}
	for _, tc := range []struct {
		name   string
		layers []LayerInfo
		want   int
	}{
		{"all local", []LayerInfo{loc, loc, loc}, 3},
		{"all published", []LayerInfo{pub, cov, pub}, 3},
		{"local on published", []LayerInfo{loc, loc, pub, pub}, 2},
		{"published on local", []LayerInfo{pub, loc, loc}, 2},
		{"empty", nil, 0},
	} {
		if got := squashRun(tc.layers); got != tc.want {
			t.Errorf("%s: squashRun = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A deep chain is reported, as a deep commit is, so that the agent
// squashes before overlay's depth limit.
func TestSyncReportsNeedsSquash(t *testing.T) {
	reg := registry{}
	a := newTestStore(t, Options{})
	for i := range 3 {
		commitFiles(t, a, "ns/c", map[string]string{fmt.Sprintf("f%d", i): "x"})
	}
	chain := publish(t, a, reg, "ns/c")
	for _, tc := range []struct {
		maxLayers int
		want      bool
	}{{2, true}, {3, false}} {
		b := newTestStore(t, Options{MaxLayers: tc.maxLayers})
		if res := mustSync(t, b, "ns/c", chain, reg.fetch); res.NeedsSquash != tc.want {
			t.Errorf("max layers %d: Sync = %+v, want NeedsSquash %v", tc.maxLayers, res, tc.want)
		}
	}
}
