package layerfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/layercache/layercache/internal/benchsize"
	"github.com/layercache/layercache/internal/benchtime"
)

// Commit latency when many builds end at once (issue 18): 50 volumes over 5
// caches, each with a unique file and 3 MiB in 300 small files still dirty
// in the page cache, as a build leaves them, committed from 50 goroutines
// at once, while two more builds keep writing (50 MB/s in all), as the
// node's other builds do. Reports the p50 and p99 of the time from calling
// Commit to its return (target: p99 <= 2 s), the median time of one such
// commit alone, in the same store, measured before, and the p99 from the
// burst's start when 4 goroutines take the 50 commits in turn (the node
// agent's build-end workers). LAYERFS_BENCH_WRITE_MBS sets the running
// builds' rate of writing. At smoke size the burst is 20 volumes of 100
// files each (p99 is then the slowest commit), beside the same writers.
func BenchmarkConcurrentCommits(b *testing.B) {
	rate := benchsize.Env(b, "LAYERFS_BENCH_WRITE_MBS", 50, "a number of MB per second")
	const caches, fileSize = 5, 10 << 10
	volumes, files := benchsize.Pick(b, 50, 20), benchsize.Pick(b, 300, 100)
	root, err := os.MkdirTemp("/var/tmp", "layerfs-bench-")
	must(b, err)
	b.Cleanup(func() { os.RemoveAll(root) })
	s := newTestStore(b, Options{Root: root, MaxLayers: 400})
	data := make([]byte, fileSize)
	build := func(id, cache string) {
		merged := mustMount(b, s, id, cache)
		writeFile(b, filepath.Join(merged, "unique", id), id)
		for i := range files {
			dir := filepath.Join(merged, "deps", fmt.Sprintf("d%02d", i/30))
			if i%30 == 0 {
				must(b, os.MkdirAll(dir, 0o755))
			}
			data[0] = byte(i)
			must(b, os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%03d", id, i)), data, 0o644))
		}
	}
	cacheName := func(i int) string { return fmt.Sprintf("ns/c%d", i%caches) }
	// burst builds the volumes, then commits them with workers goroutines
	// and returns each commit's latency from the burst's start.
	burst := func(workers int) []time.Duration {
		ids := make([]string, volumes)
		for i := range ids {
			ids[i] = fmt.Sprintf("v%02d-%s", i, randomID())
			build(ids[i], cacheName(i))
		}
		stop := make(chan struct{})
		var running sync.WaitGroup
		for i := range 2 {
			merged := mustMount(b, s, fmt.Sprintf("running-%d-%s", i, randomID()), cacheName(i))
			running.Go(func() { keepWriting(b, merged, time.Second/time.Duration(2*rate), stop) })
		}
		time.Sleep(time.Second) // the running builds' writes are under way
		lat := make([]time.Duration, volumes)
		queue := make(chan int, volumes)
		for i := range ids {
			queue <- i
		}
		close(queue)
		var wg sync.WaitGroup
		t0 := time.Now()
		for range workers {
			wg.Go(func() {
				for i := range queue {
					if _, err := s.Commit(context.Background(), ids[i]); err != nil {
						b.Errorf("Commit(%s): %v", ids[i], err)
					}
					lat[i] = time.Since(t0)
				}
			})
		}
		wg.Wait()
		close(stop)
		running.Wait()
		if b.Failed() {
			b.FailNow()
		}
		views := map[string]string{}
		for i, id := range ids {
			c := cacheName(i)
			if views[c] == "" {
				views[c] = view1(b, s, c)
			}
			if got := readFile(b, filepath.Join(views[c], "unique", id)); got != id {
				b.Fatalf("volume %s's unique file reads %q after the commits", id, got)
			}
		}
		slices.Sort(lat)
		return lat
	}
	p := func(lat []time.Duration, q int) time.Duration { return lat[(len(lat)*q+99)/100-1] }
	for b.Loop() {
		// One commit alone, on a quiet store: the baseline.
		var alone []time.Duration
		for i := range 3 {
			id := fmt.Sprintf("alone-%d-%s", i, randomID())
			build(id, cacheName(i))
			alone = append(alone, benchtime.Timed(func() { mustCommit(b, s, id) }))
		}
		lat := burst(volumes)
		queued := burst(4)
		b.ReportMetric(float64(benchtime.Median(alone).Milliseconds()), "alone-ms")
		b.ReportMetric(float64(p(lat, 50).Milliseconds()), "p50-ms")
		b.ReportMetric(float64(p(lat, 99).Milliseconds()), "p99-ms")
		b.ReportMetric(p(lat, 99).Seconds(), "p99-s")
		b.ReportMetric(float64(p(queued, 99).Milliseconds()), "p99-4-workers-ms")
	}
}

// keepWriting writes a 256 KiB file into dir every interval, until stop.
func keepWriting(b *testing.B, dir string, interval time.Duration, stop <-chan struct{}) {
	data := make([]byte, 256<<10)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		data[0] = byte(i)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("w%05d", i)), data, 0o644); err != nil {
			b.Error(err)
			return
		}
	}
}
