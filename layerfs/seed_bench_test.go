package layerfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/internal/benchsize"
	"github.com/layercache/layercache/internal/benchtime"
	"github.com/layercache/layercache/layerfs/tree"
)

// Seeding is as constant in the fallback's size as a mount and a commit
// are: a seeded volume mounts the fallback's layer directories, and its
// commit writes a head naming them. The fallback is a 1 GiB cache of
// 50,000 files at full size, 64 MiB in 2,000 at smoke size
// (LAYERFS_BENCH_SEED_MIB overrides the MiB).

// seedBenchFixture is a store whose cache ns/main holds the fallback.
func seedBenchFixture(b *testing.B) *Store {
	mib := benchsize.Env(b, "LAYERFS_BENCH_SEED_MIB", benchsize.Pick(b, 1024, 64), "a number of MiB")
	files := largeCacheFiles(b)
	s := newTestStore(b, Options{MaxLayers: 400})
	fillCache(b, s, "ns/main", files, mib<<20/files)
	mountDiscard(b, s, "ns/empty")() // create the empty cache
	unix.Sync()
	return s
}

// seededMountDiscard provisions and discards a volume of a cache without
// a generation, seeded from ns/main (nothing is created, so every round
// seeds anew).
func seededMountDiscard(b *testing.B, s *Store) func() {
	return func() {
		id := "bench-" + randomID()
		v := mountSeeded(b, s, id, "ns/pr", "ns/main")
		if v.SeededFrom == nil {
			b.Fatal("the volume was not seeded")
		}
		must(b, s.Discard(context.Background(), id))
	}
}

// Mount+discard of a volume seeded from the 1 GiB / 50,000-file cache vs
// one of an empty cache (target <= 1.2x).
func BenchmarkSeededMountVsEmpty(b *testing.B) {
	s := seedBenchFixture(b)
	for b.Loop() {
		empty, seeded := benchtime.Compare(mountReps(b), mountDiscard(b, s, "ns/empty"), seededMountDiscard(b, s))
		b.ReportMetric(float64(empty.Microseconds()), "empty-µs")
		b.ReportMetric(float64(seeded.Microseconds()), "seeded-µs")
		b.ReportMetric(float64(seeded)/float64(empty), "seeded/empty")
	}
}

// The commit of a 1 MiB delta that creates a cache seeded from the 1 GiB
// cache vs a normal commit of the same delta on the same layers (a volume
// of ns/main itself; target <= 1.2x), and what the seeded commits added to
// the store's disk use per byte of their deltas (target about 1: the new
// layers only). The baseline stacks the same lower layers because a
// commit's cost grows with what its overlay stacks (unmounting it): on a
// one-layer cache the plain commit was ~0.8 ms faster on the 2-core VM,
// a cost of the base, not of seeding. Each rep's plain commit adds a layer
// to ns/main, which the next seeded volume then stacks too.
func BenchmarkSeededCommitVsCommit(b *testing.B) {
	s := seedBenchFixture(b)
	delta := make([]byte, 1<<20)
	for i := range delta {
		delta[i] = byte(i) // not zeros: a hole would not take its bytes
	}
	round := 0
	prepare := func(cache string, fallbacks ...string) string {
		id := fmt.Sprintf("bench-%d-%s", round, randomID())
		round++
		v := mountSeeded(b, s, id, cache, fallbacks...)
		must(b, os.WriteFile(filepath.Join(v.MergedPath, "delta"), delta, 0o644))
		return id
	}
	for b.Loop() {
		before, _, err := tree.DiskUsage(s.layersDir())
		must(b, err)
		var seeded, plain []time.Duration
		const reps = 21
		for i := range reps {
			sid := prepare(fmt.Sprintf("ns/pr-%d", i), "ns/main")
			pid := prepare("ns/main")
			commitSeeded := func() {
				if res := mustCommit(b, s, sid); res.SeededFrom == nil {
					b.Fatalf("commit %+v was not seeded", res)
				}
			}
			commitPlain := func() { mustCommit(b, s, pid) }
			// A commit's fsyncs also write back whatever else is dirty
			// (the benchmarks before this one, a build beside it): the
			// pair starts from a clean page cache, so both pay only for
			// their own (seeded/plain was 2.6 after the other layerfs
			// benchmarks, 1.3-1.4 alone).
			unix.Sync()
			if i%2 == 0 {
				seeded = append(seeded, benchtime.Timed(commitSeeded))
				plain = append(plain, benchtime.Timed(commitPlain))
			} else {
				plain = append(plain, benchtime.Timed(commitPlain))
				seeded = append(seeded, benchtime.Timed(commitSeeded))
			}
		}
		after, _, err := tree.DiskUsage(s.layersDir())
		must(b, err)
		st, pt := benchtime.Median(seeded), benchtime.Median(plain)
		b.ReportMetric(float64(pt.Microseconds()), "plain-µs")
		b.ReportMetric(float64(st.Microseconds()), "seeded-µs")
		b.ReportMetric(float64(st)/float64(pt), "seeded/plain")
		// Both kinds of commits added a layer of the delta each.
		b.ReportMetric(float64(after-before)/float64(2*reps*len(delta)), "disk-growth/delta")
	}
}
