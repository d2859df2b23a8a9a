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
)

// Commit latency when many builds end at once (issue 18): 50 volumes over 5
// caches, each with a unique file and 3 MiB in 300 small files still dirty
// in the page cache, as a build leaves them, committed from 50 goroutines
// at once. Reports the p50 and p99 of the time from calling Commit to its
// return (target: p99 <= 2 s), and the p99 over the time one such commit
// takes alone, in the same store, measured before.
func BenchmarkConcurrentCommits(b *testing.B) {
	const (
		caches, volumes = 5, 50
		files, fileSize = 300, 10 << 10
	)
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
	for b.Loop() {
		// One commit alone, on a quiet store: the baseline.
		var alone []time.Duration
		for i := range 3 {
			id := fmt.Sprintf("alone-%d-%s", i, randomID())
			build(id, cacheName(i))
			alone = append(alone, timed(func() { mustCommit(b, s, id) }))
		}
		ids := make([]string, volumes)
		for i := range ids {
			ids[i] = fmt.Sprintf("v%02d-%s", i, randomID())
			build(ids[i], cacheName(i))
		}
		lat := make([]time.Duration, volumes)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, id := range ids {
			wg.Go(func() {
				<-start
				t0 := time.Now()
				_, err := s.Commit(context.Background(), id)
				lat[i] = time.Since(t0)
				if err != nil {
					b.Errorf("Commit(%s): %v", id, err)
				}
			})
		}
		close(start)
		wg.Wait()
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
		p50, p99 := lat[len(lat)/2], lat[(len(lat)*99+99)/100-1]
		b.ReportMetric(float64(median(alone).Milliseconds()), "alone-ms")
		b.ReportMetric(float64(p50.Milliseconds()), "p50-ms")
		b.ReportMetric(float64(p99.Milliseconds()), "p99-ms")
		b.ReportMetric(p99.Seconds(), "p99-s")
	}
}
