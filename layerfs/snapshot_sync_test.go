package layerfs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"testing"
)

// publishSnapshot publishes snapshot cache's head generation, if it is
// not yet, as the newest layer of chain, as the node agent does.
func publishSnapshot(t testing.TB, s *Store, reg registry, cache string, chain Chain) Chain {
	t.Helper()
	ctx := context.Background()
	ref := mustRef(t, cache)
	info, err := s.Inspect(ctx, ref)
	must(t, err)
	l := info.Layers[0]
	if l.Digest != "" {
		return chain
	}
	var buf bytes.Buffer
	must(t, s.ExportLayer(ctx, ref, l.ID, &buf))
	d := reg.put(buf.Bytes())
	must(t, s.SetLayerDigest(ctx, ref, l.ID, d))
	return Chain{
		Generation: chain.Generation + 1,
		Layers:     append([]ChainLayer{{Digest: d, Size: int64(buf.Len()), Format: FormatEROFS}}, chain.Layers...),
	}
}

// commitSnapshotStep mounts a snapshot volume of cache, runs step in it
// and commits it.
func commitSnapshotStep(t testing.TB, s *Store, cache string, step func(testing.TB, string)) {
	t.Helper()
	id := "build-" + randomID()
	v := mountSnapshot(t, s, id, cache, MountOptions{})
	step(t, v.MergedPath)
	mustCommit(t, s, id)
}

func syncSnapshotCache(t testing.TB, s *Store, cache string, chain Chain, fetch Fetch) SyncResult {
	t.Helper()
	res, err := s.Sync(context.Background(), mustRef(t, cache), chain, fetch, SyncOptions{Layout: LayoutSnapshot})
	if err != nil {
		t.Fatalf("Sync(%s): %v", cache, err)
	}
	return res
}

// TestSnapshotCacheCrossesStores: each commit on node A is published as
// a whole generation, and node B, on the other kind of root, takes in the
// newest and shows what A shows; a second sync of the same chain changes
// nothing, and nothing is left that no head or record names.
func TestSnapshotCacheCrossesStores(t *testing.T) {
	a, b := newSnapshotStore(t, "image"), newSnapshotStore(t, "btrfs")
	reg := registry{}
	var chain Chain
	for i, step := range layerSteps {
		commitSnapshotStep(t, a, "ns/c", step)
		chain = publishSnapshot(t, a, reg, "ns/c", chain)
		res := syncSnapshotCache(t, b, "ns/c", chain, reg.fetch)
		if !res.Changed || res.Fetched != 1 || res.Generation != chain.Generation {
			t.Fatalf("step %d: Sync = %+v; want one generation fetched, generation %d", i, res, chain.Generation)
		}
		if d := diffSnapshots(view(t, a, "ns/c"), view(t, b, "ns/c")); d != "" {
			t.Fatalf("step %d: node B's cache differs from node A's:\n%s", i, d)
		}
		if again := syncSnapshotCache(t, b, "ns/c", chain, reg.fetch); again.Changed || again.Fetched != 0 {
			t.Errorf("step %d: a second Sync of the same chain = %+v, want no change", i, again)
		}
		assertNoSnapshotOrphans(t, b)
	}
	// B's own commit is the next writer: its publish makes A follow it.
	commitSnapshotStep(t, b, "ns/c", func(t testing.TB, d string) { writeFile(t, filepath.Join(d, "from-b"), "b") })
	chain = publishSnapshot(t, b, reg, "ns/c", chain)
	syncSnapshotCache(t, a, "ns/c", chain, reg.fetch)
	if got := readCacheFile(t, a, "ns/c", "from-b"); got != "b" {
		t.Errorf("node A's from-b = %q, want node B's later commit", got)
	}
}

// TestSnapshotSyncKeepsLaterWriter: a node's commit that is not yet
// published is a later writer than every generation the chain lists
// (its publish will append it), so a Sync keeps it; a stale chain (older
// than the last taken in) changes nothing either.
func TestSnapshotSyncKeepsLaterWriter(t *testing.T) {
	a, b := newSnapshotStore(t, "image"), newSnapshotStore(t, "image")
	reg := registry{}
	buildSnapshot(t, a, "a1", "ns/c", map[string]string{"f": "a1"})
	chain := publishSnapshot(t, a, reg, "ns/c", Chain{})
	syncSnapshotCache(t, b, "ns/c", chain, reg.fetch)
	buildSnapshot(t, b, "b1", "ns/c", map[string]string{"f": "b1"})
	buildSnapshot(t, a, "a2", "ns/c", map[string]string{"f": "a2"})
	newer := publishSnapshot(t, a, reg, "ns/c", chain)
	if res := syncSnapshotCache(t, b, "ns/c", newer, reg.fetch); res.Changed {
		t.Errorf("Sync over an unpublished commit = %+v, want it kept", res)
	}
	if got := readCacheFile(t, b, "ns/c", "f"); got != "b1" {
		t.Errorf("node B's f = %s, want its own later commit b1", got)
	}
	c := newSnapshotStore(t, "image")
	syncSnapshotCache(t, c, "ns/c", newer, reg.fetch)
	if res := syncSnapshotCache(t, c, "ns/c", chain, reg.fetch); res.Changed {
		t.Errorf("Sync of a stale chain = %+v, want no change", res)
	}
}

// TestSnapshotSyncRefusals: a generation that is too large, corrupt, of
// another format or cut short is not taken in; the head and the area
// stay as they were.
func TestSnapshotSyncRefusals(t *testing.T) {
	a := newSnapshotStore(t, "image")
	reg := registry{}
	buildSnapshot(t, a, "a1", "ns/c", map[string]string{"f": "1", "g": string(make([]byte, 1<<20))})
	chain := publishSnapshot(t, a, reg, "ns/c", Chain{})
	good := chain.Layers[0]
	// One more inode in the superblock than the tree holds, as in
	// TestSyncRefusesAnImageTheStoreDidNotWrite: a tenant's forgery.
	corrupt := slices.Clone(reg[good.Digest])
	const inodes = 1024 + 16
	binary.LittleEndian.PutUint64(corrupt[inodes:], binary.LittleEndian.Uint64(corrupt[inodes:])+1)
	bad := reg.put(corrupt)
	for _, tt := range []struct {
		name  string
		layer ChainLayer
		opts  SyncOptions
		fetch Fetch
		want  error
	}{
		{"over the bound", good, SyncOptions{MaxLayerBytes: 4096}, reg.fetch, ErrTooLarge},
		{"corrupt image", ChainLayer{Digest: bad, Size: int64(len(corrupt)), Format: FormatEROFS}, SyncOptions{}, reg.fetch, ErrInvalidImage},
		{"not an image", ChainLayer{Digest: good.Digest, Size: good.Size, Format: "tar"}, SyncOptions{}, reg.fetch, ErrInvalidImage},
		{"cut short", good, SyncOptions{}, func(context.Context, ChainLayer) (io.ReadCloser, error) {
			return io.NopCloser(io.MultiReader(bytes.NewReader(reg[good.Digest][:8192]), iotestErr{})), nil
		}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSnapshotStore(t, "image")
			buildSnapshot(t, s, "mine", "ns/c", map[string]string{"f": "mine"})
			chain := publishSnapshot(t, s, registry{}, "ns/c", Chain{})
			before := view(t, s, "ns/c")
			tt.opts.Layout = LayoutSnapshot
			_, err := s.Sync(context.Background(), mustRef(t, "ns/c"), Chain{Generation: chain.Generation + 1, Layers: []ChainLayer{tt.layer}}, tt.fetch, tt.opts)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("Sync: %v, want %v", err, tt.want)
			}
			if d := diffSnapshots(before, view(t, s, "ns/c")); d != "" {
				t.Errorf("a refused Sync changed the cache:\n%s", d)
			}
			assertNoSnapshotOrphans(t, s)
		})
	}
}

// TestSyncLayoutMismatch: a Sync for one layout does not take in a cache
// of the other; without a layout it keeps the cache's own.
func TestSyncLayoutMismatch(t *testing.T) {
	s := newSnapshotStore(t, "image")
	buildSnapshot(t, s, "a", "ns/snap", map[string]string{"f": "1"})
	commitFiles(t, s, "ns/over", map[string]string{"f": "1"})
	ctx := context.Background()
	for _, tt := range []struct {
		cache  string
		layout Layout
	}{{"ns/snap", LayoutOverlay}, {"ns/over", LayoutSnapshot}} {
		if _, err := s.Sync(ctx, mustRef(t, tt.cache), Chain{}, nil, SyncOptions{Layout: tt.layout}); !errors.Is(err, ErrLayoutMismatch) {
			t.Errorf("Sync(%s, %s): %v, want ErrLayoutMismatch", tt.cache, tt.layout, err)
		}
	}
	if _, err := s.Sync(ctx, mustRef(t, "ns/snap"), Chain{Generation: 1}, nil, SyncOptions{}); err != nil {
		t.Errorf("Sync of a snapshot cache without a layout: %v", err)
	}
}

// readCacheFile reads file name of snapshot cache through a view.
func readCacheFile(t testing.TB, s *Store, cache, name string) string {
	t.Helper()
	id := "read-" + randomID()
	v := mountSnapshot(t, s, id, cache, MountOptions{ReadOnly: true})
	defer func() { must(t, s.Discard(context.Background(), id)) }()
	return readFile(t, filepath.Join(v.MergedPath, name))
}

// cancelOnClose cancels a context when the fetched blob is closed: the
// image is then all here, and its copy into the generation starts after
// the deadline.
type cancelOnClose struct {
	io.Reader
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error { c.cancel(); return nil }

// TestSnapshotSyncStopsAtItsDeadline: a pull past its deadline stops
// copying (a volume waits for it no longer than its class's syncTimeout)
// and leaves the cache and the area as they were.
func TestSnapshotSyncStopsAtItsDeadline(t *testing.T) {
	a, b := newSnapshotStore(t, "image"), newSnapshotStore(t, "image")
	reg := registry{}
	buildSnapshot(t, a, "a1", "ns/c", map[string]string{"f": "1", "g": "2"})
	chain := publishSnapshot(t, a, reg, "ns/c", Chain{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fetch := func(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
		rc, err := reg.fetch(ctx, l)
		if err != nil {
			return nil, err
		}
		return cancelOnClose{Reader: rc, cancel: cancel}, nil
	}
	_, err := b.Sync(ctx, mustRef(t, "ns/c"), chain, fetch, SyncOptions{Layout: LayoutSnapshot})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync past its deadline: %v, want context.Canceled", err)
	}
	if _, err := b.Inspect(context.Background(), mustRef(t, "ns/c")); !errors.Is(err, ErrNotFound) {
		t.Errorf("a Sync cut short left the cache: %v", err)
	}
	assertNoSnapshotOrphans(t, b)
}
