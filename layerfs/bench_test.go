package layerfs

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	cfs "github.com/containerd/continuity/fs"
	"golang.org/x/sys/unix"
)

// Each benchmark measures layercache and its baseline in the same run and
// reports their ratio as a metric; absolute times vary between machines,
// ratios much less. `make bench` runs them.

// compare runs a and b reps times each, in pairs whose order alternates,
// and returns the median duration of each. Each operation leaves deferred
// work (writeback, journal commits) that the next one pays for; alternating
// spreads it evenly, and medians ignore the odd slow sync.
func compare(reps int, a, b func()) (time.Duration, time.Duration) {
	var ta, tb []time.Duration
	for i := range reps {
		if i%2 == 0 {
			ta = append(ta, timed(a))
			tb = append(tb, timed(b))
		} else {
			tb = append(tb, timed(b))
			ta = append(ta, timed(a))
		}
	}
	return median(ta), median(tb)
}

func timed(fn func()) time.Duration {
	start := time.Now()
	fn()
	return time.Since(start)
}

func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func mountDiscard(b *testing.B, s *Store, cache string) func() {
	return func() {
		id := "bench-" + randomID()
		mustMount(b, s, id, cache)
		if err := s.Discard(context.Background(), id); err != nil {
			b.Fatal(err)
		}
	}
}

// fillCache commits one layer of n files of size bytes each.
func fillCache(b *testing.B, s *Store, cache string, n, size int) {
	b.Helper()
	merged := mustMount(b, s, "fill", cache)
	data := make([]byte, size)
	for i := range n {
		dir := filepath.Join(merged, fmt.Sprintf("d%03d", i/1000))
		if i%1000 == 0 {
			must(b, os.Mkdir(dir, 0o755))
		}
		must(b, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), data, 0o644))
	}
	mustCommit(b, s, "fill")
}

// Mount+discard of a 50,000-file cache vs an empty one (target <= 1.5x).
func BenchmarkMountLargeVsEmptyCache(b *testing.B) {
	s := newTestStore(b, Options{})
	fillCache(b, s, "ns/large", 50000, 64)
	mountDiscard(b, s, "ns/empty")() // create the empty cache
	unix.Sync()
	for b.Loop() {
		empty, large := compare(51, mountDiscard(b, s, "ns/empty"), mountDiscard(b, s, "ns/large"))
		b.ReportMetric(float64(empty.Microseconds()), "empty-µs")
		b.ReportMetric(float64(large.Microseconds()), "50k-files-µs")
		b.ReportMetric(float64(large)/float64(empty), "large/empty")
	}
}

// Commit of a 1 MiB delta on a 1 GiB cache vs a recursive copy of the cache,
// which is what copy-based peers do per build (target >= 100x faster).
func BenchmarkCommitVsCopy(b *testing.B) {
	s := newTestStore(b, Options{MaxLayers: 400})
	fillCache(b, s, "ns/big", 1024, 1<<20)
	delta := make([]byte, 1<<20)
	src := view1(b, s, "ns/big")
	unix.Sync()
	for b.Loop() {
		var commits []time.Duration
		for range 11 {
			id := "bench-" + randomID()
			must(b, os.WriteFile(filepath.Join(mustMount(b, s, id, "ns/big"), "delta"), delta, 0o644))
			commits = append(commits, timed(func() { mustCommit(b, s, id) }))
		}
		commitTime := median(commits)
		// The copy is made durable too, as a commit is.
		dst := filepath.Join(b.TempDir(), "copy")
		copyTime := timed(func() {
			must(b, cfs.CopyDir(dst, src))
			unix.Sync()
		})
		b.ReportMetric(float64(commitTime.Microseconds()), "commit-µs")
		b.ReportMetric(float64(copyTime.Milliseconds()), "copy-ms")
		b.ReportMetric(float64(copyTime)/float64(commitTime), "copy/commit")
	}
}

// view1 mounts a volume of cache for reading and returns its path; the
// test store's cleanup unmounts it.
func view1(b *testing.B, s *Store, cache string) string {
	return mustMount(b, s, "view-"+randomID(), cache)
}

// Mount after 200 commits with squashing vs after 1 commit (target <= 1.5x).
func BenchmarkMountAfterManyCommits(b *testing.B) {
	ctx := context.Background()
	s := newTestStore(b, Options{MaxLayers: DefaultMaxLayers})
	for i := range 200 {
		id := fmt.Sprintf("c%d", i)
		writeFile(b, filepath.Join(mustMount(b, s, id, "ns/many"), fmt.Sprintf("f%d", i)), "x")
		if mustCommit(b, s, id).NeedsSquash {
			if _, err := s.Squash(ctx, mustRef(b, "ns/many"), 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	writeFile(b, filepath.Join(mustMount(b, s, "one", "ns/one"), "f"), "x")
	mustCommit(b, s, "one")
	unix.Sync()
	for b.Loop() {
		one, many := compare(51, mountDiscard(b, s, "ns/one"), mountDiscard(b, s, "ns/many"))
		b.ReportMetric(float64(one.Microseconds()), "1-commit-µs")
		b.ReportMetric(float64(many.Microseconds()), "200-commits-µs")
		b.ReportMetric(float64(many)/float64(one), "200/1")
	}
}

// Reading a 100 MiB file through a 16-deep chain vs from a plain directory
// (target >= 0.9x the throughput).
func BenchmarkReadThroughChain(b *testing.B) {
	s := newTestStore(b, Options{})
	data := make([]byte, 100<<20)
	for i := range data {
		data[i] = byte(i)
	}
	writeFile(b, filepath.Join(mustMount(b, s, "bottom", "ns/deep"), "big"), string(data))
	mustCommit(b, s, "bottom")
	for i := range 15 {
		id := fmt.Sprintf("l%d", i)
		writeFile(b, filepath.Join(mustMount(b, s, id, "ns/deep"), fmt.Sprintf("small%d", i)), "x")
		mustCommit(b, s, id)
	}
	direct := filepath.Join(b.TempDir(), "big")
	must(b, os.WriteFile(direct, data, 0o644))
	layered := filepath.Join(view1(b, s, "ns/deep"), "big")
	read := func(path string) func() {
		return func() {
			f, err := os.Open(path)
			must(b, err)
			defer f.Close()
			if n, err := io.Copy(io.Discard, f); err != nil || n != int64(len(data)) {
				b.Fatalf("read %s: %d bytes, %v", path, n, err)
			}
		}
	}
	read(direct)()
	read(layered)() // warm both page caches alike
	for b.Loop() {
		d, l := compare(11, read(direct), read(layered))
		b.ReportMetric(float64(len(data))/d.Seconds()/(1<<20), "direct-MiB/s")
		b.ReportMetric(float64(len(data))/l.Seconds()/(1<<20), "chain-MiB/s")
		b.ReportMetric(float64(d)/float64(l), "chain/direct-throughput")
	}
}
