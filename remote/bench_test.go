package remote_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/internal/benchsize"
	"github.com/layercache/layercache/internal/benchtime"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/remote"
	"github.com/layercache/layercache/remote/registrytest"
)

// The benchmarks here measure caches across nodes: two stores in temp
// roots stand for two nodes, the registry is go-containerregistry's
// in-process one over TLS on loopback. Each reports ratios against a
// baseline measured in the same run. `make bench` runs them.
//
// The cache is 50,000 files, 1 GiB in all at full size (as
// docs/performance.md reports), 1,000 files and 16 MiB at smoke size (internal/benchsize);
// LAYERCACHE_BENCH_FILES and LAYERCACHE_BENCH_BYTES override them. Half of
// each file is random and half repeats, so it compresses about 2:1, as
// build caches of objects and archives do.

func benchSize(b *testing.B) (files int, bytes int64) {
	files = benchsize.Env(b, "LAYERCACHE_BENCH_FILES", benchsize.Pick(b, 50_000, 1_000), "a file count")
	bytes = benchsize.Env(b, "LAYERCACHE_BENCH_BYTES", benchsize.Pick[int64](b, 1<<30, 16<<20), "a byte count")
	if bytes < int64(files) {
		b.Fatalf("%d bytes for %d files: want at least one byte per file (LAYERCACHE_BENCH_BYTES, LAYERCACHE_BENCH_FILES)", bytes, files)
	}
	return files, bytes
}

var benchCache = layerfs.CacheRef{Namespace: "bench", Name: "maven"}

// benchNode is a store standing for one node.
type benchNode struct {
	b     *testing.B
	store *layerfs.Store
	// layout is the layout of the node's volumes ("" is overlay).
	layout layerfs.Layout
}

func newBenchNode(b *testing.B) *benchNode {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Fatal("needs root: the benchmark makes real overlay mounts; run `make bench` as root")
	}
	root := b.TempDir()
	st, err := layerfs.Open(context.Background(), layerfs.Options{Root: root})
	if err != nil {
		b.Fatal(err)
	}
	n := &benchNode{b: b, store: st}
	b.Cleanup(n.unmountAll)
	return n
}

// unmountAll unmounts the store's volumes and pulled layers, deepest
// first, so that the temp dir can go.
func (n *benchNode) unmountAll() {
	mounts, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(n.store.Root()))
	slices.SortFunc(mounts, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
	for _, m := range mounts {
		unix.Unmount(m.Mountpoint, unix.MNT_DETACH)
	}
}

func (n *benchNode) mount(id string) string {
	n.b.Helper()
	v, err := n.store.Mount(context.Background(), id, layerfs.MountOptions{Cache: benchCache, Layout: n.layout})
	if err != nil {
		n.b.Fatal(err)
	}
	return v.MergedPath
}

func (n *benchNode) commit(id string) layerfs.CommitResult {
	n.b.Helper()
	res, err := n.store.Commit(context.Background(), id)
	if err != nil {
		n.b.Fatal(err)
	}
	return res
}

// fill commits one layer of files files holding bytes in all.
func (n *benchNode) fill(files int, bytes int64) string {
	n.b.Helper()
	merged := n.mount("fill")
	rng := rand.New(rand.NewChaCha8([32]byte{1}))
	size := int(bytes / int64(files))
	data := make([]byte, size)
	for i := range files {
		dir := filepath.Join(merged, fmt.Sprintf("d%03d", i/1000))
		if i%1000 == 0 {
			if err := os.Mkdir(dir, 0o755); err != nil {
				n.b.Fatal(err)
			}
		}
		for j := 0; j < size/2; j += 8 {
			v := rng.Uint64()
			for k := 0; k < 8 && j+k < size/2; k++ {
				data[j+k] = byte(v >> (8 * k))
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), data, 0o644); err != nil {
			n.b.Fatal(err)
		}
	}
	return n.commit("fill").Layer
}

func benchTarget(b *testing.B, reg *registrytest.Registry, c remote.Compression) *remote.Target {
	return benchTargetAt(b, reg, "bench/maven", c)
}

func benchTargetAt(b *testing.B, reg *registrytest.Registry, repo string, c remote.Compression) *remote.Target {
	b.Helper()
	t, err := remote.NewTarget(reg.Host+"/"+repo, remote.Credentials{
		DockerConfigJSON: reg.DockerConfig(registrytest.User, registrytest.Password), CAPEM: reg.CA}, c)
	if err != nil {
		b.Fatal(err)
	}
	return t
}

func (n *benchNode) push(t *remote.Target, layer string) remote.Blob {
	n.b.Helper()
	blob, err := t.PushLayer(context.Background(), n.b.TempDir(), func(w io.Writer) error {
		return n.store.ExportLayer(context.Background(), benchCache, layer, w)
	})
	if err != nil {
		n.b.Fatal(err)
	}
	return blob
}

// BenchmarkPushCompression pushes one large layer's image zstd- and
// gzip-compressed and reports each one's throughput in MB/s of the layer's
// files, and their ratio: the default compression is the faster one. It
// also pushes the layer as a zstd tar, as layers were published before
// images: the image's push must not be slower (image/tar-push). Each kind
// is pushed three times, in turns, each time to a new repository (a
// registry that has the blob skips the upload); medians count.
func BenchmarkPushCompression(b *testing.B) {
	files, bytes := benchSize(b)
	src := newBenchNode(b)
	layer := src.fill(files, bytes)
	reg := registrytest.New(b)
	pushes := map[string]func(repo string) remote.Blob{
		"zstd": func(repo string) remote.Blob { return src.push(benchTargetAt(b, reg, repo, remote.Zstd), layer) },
		"gzip": func(repo string) remote.Blob { return src.push(benchTargetAt(b, reg, repo, remote.Gzip), layer) },
		"tar": func(repo string) remote.Blob {
			return pushTar(b, benchTargetAt(b, reg, repo, remote.Zstd), src.layerDir(layer))
		},
	}
	order := []string{"zstd", "gzip", "tar"}
	took := map[string][]time.Duration{}
	var blobs = map[string]remote.Blob{}
	for round := range 3 {
		for i := range order {
			kind := order[(i+round)%len(order)]
			unix.Sync()
			start := time.Now()
			blobs[kind] = pushes[kind](fmt.Sprintf("bench/push-%s-%d", kind, round))
			took[kind] = append(took[kind], time.Since(start))
		}
	}
	mbps := map[string]float64{}
	for _, kind := range order {
		mbps[kind] = float64(bytes) / 1e6 / benchtime.Median(took[kind]).Seconds()
		b.ReportMetric(mbps[kind], kind+"-MB/s")
		b.ReportMetric(float64(blobs[kind].ImageBytes)/float64(blobs[kind].Size), kind+"-ratio")
	}
	b.ReportMetric(mbps["zstd"]/mbps["gzip"], "zstd/gzip-speed")
	b.ReportMetric(mbps[string(remote.DefaultCompression)]/mbps["tar"], "image/tar-push")
}

// layerDir is where the store keeps a layer's files (layerfs's layout).
func (n *benchNode) layerDir(id string) string {
	return filepath.Join(n.store.Root(), "layers", id)
}

// pushTar pushes the tree at dir as a plain tar, the way layers were
// published before images (and the way a plain client's pull expects).
func pushTar(b *testing.B, t *remote.Target, dir string) remote.Blob {
	b.Helper()
	blob, err := t.PushLayer(context.Background(), b.TempDir(), func(w io.Writer) error {
		tw := tar.NewWriter(w)
		if err := tw.AddFS(os.DirFS(dir)); err != nil {
			return err
		}
		return tw.Close()
	})
	if err != nil {
		b.Fatal(err)
	}
	return blob
}

// fetchFrom fetches chain layers as the node agent does.
func fetchFrom(t *remote.Target) layerfs.Fetch {
	return func(ctx context.Context, l layerfs.ChainLayer) (io.ReadCloser, error) {
		return t.Fetch(ctx, l.Digest, l.Size)
	}
}

func chainLayer(blob remote.Blob) layerfs.ChainLayer {
	return layerfs.ChainLayer{Digest: blob.Digest.String(), Size: blob.Size, Format: layerfs.FormatEROFS}
}

// BenchmarkPullOntoFreshNode makes a large cache available on a node that
// has none of it: Sync (fetch, verify, decompress, write the image,
// fsync, rename, mount it) and a volume's mount, against
//   - a plain registry client fetching the same blob to a file: the
//     registry's and the disk's limit for moving the bytes
//     (vs-blob-fetch, goal >= 0.8);
//   - a plain client fetching the layer as a tar and unpacking it into
//     files, as a docker-style pull does (vs-plain-pull-extract, goal
//     >= 3);
//   - the copy-based peer restoring the cache by copying its tree (cp -a)
//     from local disk (vs-copy-peer).
func BenchmarkPullOntoFreshNode(b *testing.B) {
	files, bytes := benchSize(b)
	src := newBenchNode(b)
	layer := src.fill(files, bytes)
	reg := registrytest.New(b)
	target := benchTarget(b, reg, remote.DefaultCompression)
	blob := src.push(target, layer)
	tarBlob := pushTar(b, benchTargetAt(b, reg, "bench/tar", remote.Zstd), src.layerDir(layer))
	srcTree := src.mount("source")

	// The pull and the blob fetch it is held to are the medians of three
	// runs in turns.
	var pulls, fetches []time.Duration
	for range 3 {
		pulls = append(pulls, timed(func() { pullAndMount(b, target, blob) }))
		fetches = append(fetches, timed(func() {
			fetchToFile(b, target, blob, filepath.Join(b.TempDir(), "blob"))
		}))
	}
	layercache, blobOnly := benchtime.Median(pulls), benchtime.Median(fetches)
	b.Logf("pulls %v, blob fetches %v", pulls, fetches)
	extract := timed(func() {
		plainExtract(b, target, tarBlob, b.TempDir())
	})
	cp := timed(func() {
		dst := filepath.Join(b.TempDir(), "copy")
		if out, err := exec.Command("cp", "-a", srcTree, dst).CombinedOutput(); err != nil {
			b.Fatalf("cp -a: %v: %s", err, out)
		}
		syncFS(b, dst)
	})
	b.ReportMetric(layercache.Seconds(), "layercache-s")
	b.ReportMetric(blobOnly.Seconds()/layercache.Seconds(), "vs-blob-fetch")
	b.ReportMetric(extract.Seconds()/layercache.Seconds(), "vs-plain-pull-extract")
	b.ReportMetric(cp.Seconds()/layercache.Seconds(), "vs-copy-peer")
}

// pullAndMount makes the layer a fresh node's cache and mounts a volume
// of it, durably.
func pullAndMount(b *testing.B, t *remote.Target, blob remote.Blob) {
	b.Helper()
	dst := newBenchNode(b) // the fresh node's store exists before the claim
	chain := layerfs.Chain{Generation: 1, Layers: []layerfs.ChainLayer{chainLayer(blob)}}
	if _, err := dst.store.Sync(context.Background(), benchCache, chain, fetchFrom(t), layerfs.SyncOptions{}); err != nil {
		b.Fatal(err)
	}
	dst.mount("warm")
	syncFS(b, dst.store.Root())
}

// BenchmarkDeltaReachesOtherNode commits a 1 MiB change on one node of a
// large cache that two nodes hold, and times it until a volume on the
// other node sees it: export and push of the new layer only, then fetch,
// unpack and mount on the other node (goal <= 1 s; the Cache resource's
// update, one PATCH, is not in it).
func BenchmarkDeltaReachesOtherNode(b *testing.B) {
	files, bytes := benchSize(b)
	a, other := newBenchNode(b), newBenchNode(b)
	base := a.fill(files, bytes)
	reg := registrytest.New(b)
	target := benchTarget(b, reg, remote.DefaultCompression)
	baseBlob := a.push(target, base)
	chain := layerfs.Chain{Generation: 1, Layers: []layerfs.ChainLayer{chainLayer(baseBlob)}}
	if _, err := other.store.Sync(context.Background(), benchCache, chain, fetchFrom(target), layerfs.SyncOptions{}); err != nil {
		b.Fatal(err)
	}
	merged := a.mount("delta")
	delta := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{2}).Read(delta)
	if err := os.WriteFile(filepath.Join(merged, "delta.bin"), delta, 0o644); err != nil {
		b.Fatal(err)
	}
	res := a.commit("delta")
	var fetched int
	took := timed(func() {
		blob := a.push(target, res.Layer)
		chain.Generation = 2
		chain.Layers = append([]layerfs.ChainLayer{chainLayer(blob)}, chain.Layers...)
		sr, err := other.store.Sync(context.Background(), benchCache, chain, fetchFrom(target), layerfs.SyncOptions{})
		if err != nil {
			b.Fatal(err)
		}
		fetched = sr.Fetched
		if _, err := os.Stat(filepath.Join(other.mount("sees-delta"), "delta.bin")); err != nil {
			b.Fatal(err)
		}
	})
	if fetched != 1 {
		b.Errorf("the other node fetched %d layers for a one-layer delta, want 1", fetched)
	}
	b.ReportMetric(took.Seconds(), "delta-s")
}

// timed times fn after flushing what earlier steps left dirty, so that no
// step pays for another's writeback (each step syncs its own writes).
func timed(fn func()) time.Duration {
	unix.Sync()
	start := time.Now()
	fn()
	return time.Since(start)
}

func syncFS(b *testing.B, path string) {
	b.Helper()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		b.Fatal(err)
	}
}

func fetchToFile(b *testing.B, t *remote.Target, blob remote.Blob, path string) {
	b.Helper()
	rc, err := t.FetchCompressed(context.Background(), blob.Digest.String())
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		b.Fatal(err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		b.Fatal(err)
	}
}

// plainExtract is a docker-style pull: fetch, decompress, untar.
func plainExtract(b *testing.B, t *remote.Target, blob remote.Blob, dir string) {
	b.Helper()
	rc, err := t.Fetch(context.Background(), blob.Digest.String(), blob.Size)
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		path := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(path, os.FileMode(h.Mode))
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)); err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	syncFS(b, dir)
}
