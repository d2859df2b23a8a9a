package layerfs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/erofs"
	"github.com/layercache/layercache/layerfs/ondisk"
)

// A pulled layer is its image, mounted: after a reboot (the mount gone)
// Recover mounts it again before anything stacks it, and a volume's mount
// mounts it too if Recover has not run yet (the CLI).
func TestPulledLayersSurviveAReboot(t *testing.T) {
	ctx := context.Background()
	a, b := newTestStore(t, Options{}), newTestStore(t, Options{})
	commitFiles(t, a, "ns/c", map[string]string{"f": "pulled"})
	reg := registry{}
	chain := publish(t, a, reg, "ns/c")
	mustSync(t, b, "ns/c", chain, reg.fetch)
	id := headIDs(t, b, "ns/c")[0]
	for name, restore := range map[string]func(){
		"Recover":  func() { _, err := b.Recover(ctx); must(t, err) },
		"a volume": func() {},
	} {
		t.Run(name, func(t *testing.T) {
			must(t, ondisk.Unmount(b.layerDir(id))) // what a reboot does
			restore()
			if got := readFile(t, filepath.Join(mustMount(t, b, "v-"+randomID(), "ns/c"), "f")); got != "pulled" {
				t.Fatalf("after the layer's mount was gone, a volume reads %q, want the pulled layer's content", got)
			}
			if !ondisk.IsMountPoint(b.layerDir(id)) {
				t.Fatalf("layer %s is not mounted", id)
			}
		})
	}
}

// Removing a cache removes its pulled layers' mounts and images.
func TestSweepRemovesPulledImages(t *testing.T) {
	ctx := context.Background()
	a, b := newTestStore(t, Options{}), newTestStore(t, Options{})
	commitFiles(t, a, "ns/c", map[string]string{"f": "x"})
	reg := registry{}
	mustSync(t, b, "ns/c", publish(t, a, reg, "ns/c"), reg.fetch)
	id := headIDs(t, b, "ns/c")[0]
	must(t, b.Remove(ctx, mustRef(t, "ns/c")))
	_, err := b.GC(ctx, GCOptions{})
	must(t, err)
	assertMissing(t, b.layerDir(id))
	assertMissing(t, b.images().Path(id))
	assertNoOrphans(t, b)
}

// Bounds before bytes: a layer larger than SyncOptions.MaxLayerBytes is
// refused by the size its chain states before anything is fetched, and by
// its image's superblock before the rest is written; nothing of it stays,
// and the head is unchanged.
func TestSyncRefusesLayersOverTheBound(t *testing.T) {
	ctx := context.Background()
	a := newTestStore(t, Options{})
	commitFiles(t, a, "ns/c", map[string]string{"big": strings.Repeat("x", 256<<10)})
	reg := registry{}
	chain := publish(t, a, reg, "ns/c")
	image := reg[chain.Layers[0].Digest]
	const bound = 128 << 10
	for _, tc := range []struct {
		name    string
		layer   ChainLayer
		fetches bool // whether the bound is met only after the fetch began
	}{
		{"stated blob size", ChainLayer{Digest: chain.Layers[0].Digest, Format: FormatEROFS, Size: int64(len(image))}, false},
		{"image superblock", ChainLayer{Digest: chain.Layers[0].Digest, Format: FormatEROFS}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestStore(t, Options{})
			fetched := false
			fetch := func(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
				fetched = true
				return reg.fetch(ctx, l)
			}
			_, err := b.Sync(ctx, mustRef(t, "ns/c"), Chain{Generation: 1, Layers: []ChainLayer{tc.layer}}, fetch, SyncOptions{MaxLayerBytes: bound})
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), tc.layer.Digest) {
				t.Fatalf("Sync of a layer over %d bytes = %v, want ErrTooLarge naming the layer", bound, err)
			}
			if fetched != tc.fetches {
				t.Errorf("fetched = %v, want %v", fetched, tc.fetches)
			}
			if _, err := b.Inspect(ctx, mustRef(t, "ns/c")); !errors.Is(err, ErrNotFound) {
				t.Errorf("the refused Sync left a cache behind: %v", err)
			}
			assertNoOrphans(t, b)
		})
	}
}

// A stream longer or shorter than its image's superblock says is refused.
func TestSyncRefusesImagesOfTheWrongLength(t *testing.T) {
	ctx := context.Background()
	a := newTestStore(t, Options{})
	commitFiles(t, a, "ns/c", map[string]string{"f": "x"})
	reg := registry{}
	image := reg[publish(t, a, reg, "ns/c").Layers[0].Digest]
	for name, blob := range map[string][]byte{
		"longer":  append(bytes.Clone(image), make([]byte, erofs.BlockSize)...),
		"shorter": image[:len(image)-erofs.BlockSize],
	} {
		t.Run(name, func(t *testing.T) {
			b := newTestStore(t, Options{})
			d := reg.put(blob)
			_, err := b.Sync(ctx, mustRef(t, "ns/c"), Chain{Generation: 1, Layers: []ChainLayer{{Digest: d, Format: FormatEROFS}}}, reg.fetch, SyncOptions{})
			if err == nil || !strings.Contains(err.Error(), "superblock") {
				t.Fatalf("Sync of a %s image = %v, want an error about its length", name, err)
			}
			assertNoOrphans(t, b)
		})
	}
}

// A pulled image is written sparsely: the holes of a sparse file take no
// space on the node.
func TestPulledImageIsSparse(t *testing.T) {
	a, b := newTestStore(t, Options{}), newTestStore(t, Options{})
	merged := mustMount(t, a, "w", "ns/c")
	f, err := os.Create(filepath.Join(merged, "sparse"))
	must(t, err)
	_, err = f.WriteAt([]byte("data"), 32<<30)
	must(t, errors.Join(err, f.Truncate(64<<30), f.Close()))
	mustCommit(t, a, "w")
	reg := registry{}
	chain := publish(t, a, reg, "ns/c")
	mustSync(t, b, "ns/c", chain, reg.fetch)
	var st unix.Stat_t
	must(t, unix.Stat(b.images().Path(headIDs(t, b, "ns/c")[0]), &st))
	if used := st.Blocks * 512; used > 1<<20 || used >= st.Size {
		t.Errorf("the image of a 64 GiB sparse file takes %d bytes of its %d on the node, want at most 1 MiB and holes", used, st.Size)
	}
	got := make([]byte, 4)
	g, err := os.Open(filepath.Join(mustMount(t, b, "r", "ns/c"), "sparse"))
	must(t, err)
	defer g.Close()
	_, err = g.ReadAt(got, 32<<30)
	must(t, err)
	if string(got) != "data" {
		t.Errorf("read %q at 32 GiB on the other node, want data", got)
	}
}
