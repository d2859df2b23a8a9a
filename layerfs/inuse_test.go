package layerfs

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Issue 8, item 4: GC decided that a cache was unused from a List taken
// before it locked the cache, so a volume mounted in between lost its
// commit ("changes were dropped"). Removals for retention decide under the
// cache lock, and Mount holds that lock until its volume is recorded.
var inUseRemovers = []struct {
	name string
	run  func(ctx context.Context, s *Store) error
}{
	{"gc", func(ctx context.Context, s *Store) error {
		_, err := s.GC(ctx, GCOptions{MaxAge: time.Nanosecond}) // every cache is expired
		return err
	}},
	{"remove-if-unused", func(ctx context.Context, s *Store) error {
		_, err := s.RemoveIfUnused(ctx, CacheRef{"ns", "c"})
		return err
	}},
}

// TestGCRemovesCacheInUse runs the removal at the worst instant: while a
// Mount is between reading the cache's head and recording its volume, as
// another process could. The removal either waits for the mount and then
// sees the volume, or times out; it never drops the volume's commit.
func TestGCRemovesCacheInUse(t *testing.T) {
	for _, rm := range inUseRemovers {
		t.Run(rm.name, func(t *testing.T) {
			s := newTestStore(t, Options{})
			for i := range 3 {
				id := fmt.Sprintf("v%d", i)
				armed := true
				ondisk.FaultPoint = func() { // the first durable step of the mount
					if !armed {
						return
					}
					armed = false
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					defer cancel()
					if err := rm.run(ctx, s); err != nil && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("%s during a mount: %v", rm.name, err)
					}
				}
				merged := mustMount(t, s, id, "ns/c")
				ondisk.FaultPoint = func() {}
				writeFile(t, filepath.Join(merged, "f"), "x")
				if res := mustCommit(t, s, id); res.Dropped {
					t.Fatalf("commit %d was dropped by a %s during its mount; a volume in use must keep its cache", i, rm.name)
				}
			}
		})
	}
}

// TestRemoveIfUnusedConcurrentMounts runs removals in a loop against
// mounts and commits (bounded: 40 volumes).
func TestRemoveIfUnusedConcurrentMounts(t *testing.T) {
	for _, rm := range inUseRemovers {
		t.Run(rm.name, func(t *testing.T) {
			ctx := context.Background()
			s := newTestStore(t, Options{})
			// Slow durable steps widen the window between a mount reading
			// the head and recording its volume.
			ondisk.FaultPoint = func() { time.Sleep(time.Millisecond) }
			t.Cleanup(func() { ondisk.FaultPoint = func() {} })
			stop := make(chan struct{})
			var (
				wg       sync.WaitGroup
				rmErr    error
				removals int
			)
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := rm.run(ctx, s); err != nil && rmErr == nil {
						rmErr = err
					}
					removals++
					time.Sleep(100 * time.Microsecond) // let mounts take the lock too
				}
			})
			dropped := 0
			for i := range 40 {
				id := fmt.Sprintf("v%d", i)
				writeFile(t, filepath.Join(mustMount(t, s, id, "ns/c"), "f"), "x")
				if res := mustCommit(t, s, id); res.Dropped {
					dropped++
				}
			}
			close(stop)
			wg.Wait()
			if rmErr != nil {
				t.Fatalf("%s: %v", rm.name, rmErr)
			}
			if dropped > 0 {
				t.Fatalf("%d of 40 commits were dropped by a concurrent %s (%d runs); a volume in use must keep its cache", dropped, rm.name, removals)
			}
			t.Logf("%d concurrent %s runs, no commit dropped", removals, rm.name)
		})
	}
}

// Issue 8, item 9: a read-only view (a reader namespace's build) kept the
// owner's retention and GC from removing the cache. It no longer does, and
// the view keeps reading its layers until it ends.
func TestReadOnlyViewDoesNotHoldCache(t *testing.T) {
	for _, rm := range inUseRemovers {
		t.Run(rm.name, func(t *testing.T) {
			ctx := context.Background()
			s := newTestStore(t, Options{})
			writeFile(t, filepath.Join(mustMount(t, s, "seed", "ns/c"), "f"), "cached")
			mustCommit(t, s, "seed")
			v, err := s.Mount(ctx, "reader", MountOptions{Cache: CacheRef{"ns", "c"}, ReadOnly: true})
			must(t, err)
			must(t, rm.run(ctx, s))
			if _, err := s.Inspect(ctx, CacheRef{"ns", "c"}); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Inspect after %s with only a read-only view: %v, want the cache removed", rm.name, err)
			}
			if got := readFile(t, filepath.Join(v.MergedPath, "f")); got != "cached" {
				t.Errorf("the read-only view reads %q after the removal, want %q", got, "cached")
			}
			must(t, s.Discard(ctx, "reader"))
			assertNoOrphans(t, s)
		})
	}
}
