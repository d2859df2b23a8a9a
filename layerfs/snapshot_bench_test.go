package layerfs

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	cfs "github.com/containerd/continuity/fs"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/internal/benchsize"
	"github.com/layercache/layercache/internal/benchtime"
)

// The snapshot layout's benchmarks, in bench_test.go's style: each
// measures the layout and its baseline in the same run and reports the
// ratio. The cache is 1 GiB at full size (as the overlay benchmarks'),
// 64 MiB at smoke size; LAYERFS_BENCH_SNAPSHOT_MIB overrides it. A smaller
// one keeps a quick run quick, at the cost of a smaller copy to compare
// commits with.

// snapshotBenchMiB is the size of the benchmarks' large cache.
func snapshotBenchMiB(b *testing.B) int {
	return benchsize.Env(b, "LAYERFS_BENCH_SNAPSHOT_MIB", benchsize.Pick(b, 1024, 64), "a number of MiB")
}

// newSnapshotBenchStore is a store on the real disk whose snapshot image
// has room for the large cache.
func newSnapshotBenchStore(b *testing.B, mib int) *Store {
	requireBtrfs(b)
	root := b.TempDir()
	b.Cleanup(func() { assertReleased(b, root) })
	return newTestStore(b, Options{Root: root, SnapshotImageBytes: int64(mib+2048) << 20})
}

// fillSnapshotCache commits one generation of files files that add up to
// mib MiB.
func fillSnapshotCache(b *testing.B, s *Store, cache string, files, mib int) {
	b.Helper()
	v := mountSnapshot(b, s, "fill", cache, MountOptions{})
	data := make([]byte, mib<<20/files)
	for i := range data {
		data[i] = byte(i)
	}
	for i := range files {
		dir := filepath.Join(v.MergedPath, fmt.Sprintf("d%03d", i/1000))
		if i%1000 == 0 {
			must(b, os.Mkdir(dir, 0o755))
		}
		must(b, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), data, 0o644))
	}
	mustCommit(b, s, "fill")
}

// snapshotBuild mounts a volume of cache, writes one small file and
// commits it: a build's whole cost to layercache.
func snapshotBuild(b *testing.B, s *Store, cache string) func() {
	return func() {
		id := "bench-" + randomID()
		v := mountSnapshot(b, s, id, cache, MountOptions{})
		writeFile(b, filepath.Join(v.MergedPath, "marker"), id)
		mustCommit(b, s, id)
	}
}

// Snapshot-volume create+commit of a 50,000-file cache vs an empty one
// (target <= 1.5x): both are constant time.
func BenchmarkSnapshotBuildLargeVsEmpty(b *testing.B) {
	mib, files := snapshotBenchMiB(b), largeCacheFiles(b)
	s := newSnapshotBenchStore(b, mib)
	fillSnapshotCache(b, s, "ns/large", files, mib)
	snapshotBuild(b, s, "ns/empty")()
	unix.Sync()
	for b.Loop() {
		empty, large := benchtime.Compare(21, snapshotBuild(b, s, "ns/empty"), snapshotBuild(b, s, "ns/large"))
		reportLargeVsEmpty(b, files, large, empty)
	}
}

// Commit of a 1 MiB delta on the large cache's volume vs a durable copy
// of the cache, what copy-based peers do per build (target >= 100x).
func BenchmarkSnapshotCommitVsCopy(b *testing.B) {
	mib := snapshotBenchMiB(b)
	s := newSnapshotBenchStore(b, mib)
	fillSnapshotCache(b, s, "ns/big", largeCacheFiles(b), mib)
	src := mountSnapshot(b, s, "src", "ns/big", MountOptions{ReadOnly: true}).MergedPath
	delta := make([]byte, 1<<20)
	unix.Sync()
	for b.Loop() {
		var commits []time.Duration
		for range 11 {
			id := "bench-" + randomID()
			v := mountSnapshot(b, s, id, "ns/big", MountOptions{})
			must(b, os.WriteFile(filepath.Join(v.MergedPath, "delta"), delta, 0o644))
			commits = append(commits, benchtime.Timed(func() { mustCommit(b, s, id) }))
		}
		commitTime := benchtime.Median(commits)
		dst := filepath.Join(b.TempDir(), "copy")
		copyTime := benchtime.Timed(func() {
			must(b, cfs.CopyDir(dst, src))
			unix.Sync()
		})
		b.ReportMetric(float64(commitTime.Microseconds()), "commit-µs")
		b.ReportMetric(float64(copyTime.Milliseconds()), "copy-ms")
		b.ReportMetric(float64(copyTime)/float64(commitTime), "copy/commit")
	}
}

// Sequential write (with fsync) and read (from disk) of a file inside a
// snapshot volume of the large cache vs a plain directory of the same
// btrfs (target >= 0.9x each).
func BenchmarkSnapshotReadWrite(b *testing.B) {
	mib := min(snapshotBenchMiB(b), 256)
	s := newSnapshotBenchStore(b, mib)
	fillSnapshotCache(b, s, "ns/big", largeCacheFiles(b), mib)
	v := mountSnapshot(b, s, "rw", "ns/big", MountOptions{})
	plain := filepath.Join(s.snapshots.Dir(), "bench-plain")
	must(b, os.Mkdir(plain, 0o755))
	b.Cleanup(func() { os.RemoveAll(plain) })
	data := make([]byte, mib<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	write := func(dir string) func() {
		return func() { must(b, writeSynced(filepath.Join(dir, "big"), data)) }
	}
	read := func(dir string) func() {
		return func() { must(b, readUncached(filepath.Join(dir, "big"), len(data))) }
	}
	for b.Loop() {
		p, w := benchtime.Compare(5, write(plain), write(v.MergedPath))
		b.ReportMetric(float64(len(data))/w.Seconds()/(1<<20), "volume-write-MiB/s")
		b.ReportMetric(float64(p)/float64(w), "write/plain")
		p, w = benchtime.Compare(5, read(plain), read(v.MergedPath))
		b.ReportMetric(float64(len(data))/w.Seconds()/(1<<20), "volume-read-MiB/s")
		b.ReportMetric(float64(p)/float64(w), "read/plain")
	}
}

func writeSynced(path string, data []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Sync()
}

// readUncached reads a file after dropping it from the page cache.
func readUncached(path string, size int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, f)
	if err == nil && n != int64(size) {
		err = fmt.Errorf("read %d bytes of %s, want %d", n, path, size)
	}
	return err
}
