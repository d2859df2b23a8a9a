package layerfs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// The crash tests run an operation in a child process (this test binary,
// re-executed) that kills itself with SIGKILL at its Nth fault point, for
// N = 1, 2, ... until the operation completes without reaching N. After
// each crash the parent checks that the cache is at its old or its new
// state, never in between, and that Recover finishes or rolls back the
// operation and leaves nothing behind.

const (
	envCrashOp   = "LAYERFS_CRASH_OP"
	envCrashRoot = "LAYERFS_CRASH_ROOT"
	envCrashAt   = "LAYERFS_CRASH_AT"
)

func TestMain(m *testing.M) {
	if op := os.Getenv(envCrashOp); op != "" {
		os.Exit(crashChild(op))
	}
	os.Exit(m.Run())
}

type crashOp struct {
	name  string
	setup func(t testing.TB, s *Store)
	run   func(ctx context.Context, s *Store) error
	// redo: after a crash and Recover, running the operation again must
	// reach its new state (a retried Sync completes).
	redo bool
	// lands: the volume "pending" is committed, and once retried after a
	// crash it must have landed.
	lands bool
	// finish, if set, ends the volume "pending" after Recover instead of
	// finishPending.
	finish func(t *testing.T, s *Store)
	// check, if set, is an invariant of the crashed store s (ref is the
	// store the operation completed in), checked after each crash and
	// after Recover.
	check func(t *testing.T, s, ref *Store)
}

var crashOps = []crashOp{
	{
		name:  "commit",
		setup: setupPendingCommit,
		run: func(ctx context.Context, s *Store) error {
			_, err := s.Commit(ctx, "pending")
			return err
		},
		lands: true,
	},
	{
		// End commits through Commit's steps, after it read the marker.
		name:  "end",
		setup: setupPendingCommit,
		run:   endOnMarker,
		// Retried by End too: the marker that decided the commit
		// outlives the crash, or the retry would discard.
		finish: func(t *testing.T, s *Store) {
			if _, err := s.Volume(context.Background(), "pending"); err == nil {
				must(t, endOnMarker(context.Background(), s))
			}
		},
		lands: true,
	},
	{
		// The first commit of a cache seeded from a fallback creates it
		// on the fallback's layers (seed_test.go has the invariant).
		name:  "seeded-commit",
		setup: setupSeededCommit,
		run: func(ctx context.Context, s *Store) error {
			_, err := s.Commit(ctx, "pending")
			return err
		},
		lands: true,
		check: checkSeededCrash,
	},
	{
		// A commit that failed after sealing its upper directory, short of
		// writing the head (a full disk), is remounted by Mount, then
		// committed again.
		name: "remount-mid-commit",
		setup: func(t testing.TB, s *Store) {
			buildChain(t, s, "ns/c", layerSteps[:2])
			merged := mustMount(t, s, "pending", "ns/c")
			layerSteps[2](t, merged)
			writeFile(t, filepath.Join(merged, ControlDir, "commit"), "")
			fixTimes(t, merged)
			r, err := s.readVolume("pending")
			must(t, err)
			_, err = overlayLayout{s}.seal(r)
			must(t, err)
		},
		run: func(ctx context.Context, s *Store) error {
			if _, err := s.Mount(ctx, "pending", MountOptions{Cache: CacheRef{"ns", "c"}}); err != nil {
				return err
			}
			_, err := s.Commit(ctx, "pending")
			return err
		},
	},
	{
		name:  "squash",
		setup: func(t testing.TB, s *Store) { buildChain(t, s, "ns/c", layerSteps) },
		run: func(ctx context.Context, s *Store) error {
			_, err := s.Squash(ctx, CacheRef{"ns", "c"}, 1)
			return err
		},
	},
	{
		name: "remove",
		setup: func(t testing.TB, s *Store) {
			buildChain(t, s, "ns/c", layerSteps)
		},
		run: func(ctx context.Context, s *Store) error { return s.Remove(ctx, CacheRef{"ns", "c"}) },
	},
	{
		name: "remove-if-unused",
		setup: func(t testing.TB, s *Store) {
			buildChain(t, s, "ns/c", layerSteps)
		},
		run: func(ctx context.Context, s *Store) error {
			removed, err := s.RemoveIfUnused(ctx, CacheRef{"ns", "c"})
			if err == nil && !removed {
				err = fmt.Errorf("cache ns/c was not removed")
			}
			return err
		},
	},
	{
		// A pull of two layers under an unpublished commit, which must
		// survive whatever the crash interrupts.
		name:  "sync",
		setup: setupSyncCrash,
		run:   runSyncCrash,
		redo:  true,
	},
}

// endOnMarker ends volume "pending", kept if its build wrote the commit
// marker, as the on-marker commit policy does.
func endOnMarker(ctx context.Context, s *Store) error {
	res, err := s.End(ctx, "pending", EndOptions{
		ControlFiles: []string{"commit"},
		Decide:       func(written map[string]bool) bool { return written["commit"] },
	})
	if err == nil && !res.Kept {
		err = fmt.Errorf("End = %+v, want the volume kept on its commit marker", res)
	}
	return err
}

// setupPendingCommit leaves volume "pending" of cache ns/c, two layers
// deep, with a third layer's changes and a commit marker, which must not
// land even after a crash.
func setupPendingCommit(t testing.TB, s *Store) {
	buildChain(t, s, "ns/c", layerSteps[:2])
	merged := mustMount(t, s, "pending", "ns/c")
	layerSteps[2](t, merged)
	writeFile(t, filepath.Join(merged, ControlDir, "commit"), "")
	fixTimes(t, merged)
}

func crashChild(opName string) int {
	at, _ := strconv.Atoi(os.Getenv(envCrashAt))
	steps := 0
	ondisk.FaultPoint = func() {
		steps++
		if steps == at {
			unix.Kill(os.Getpid(), unix.SIGKILL)
		}
	}
	ctx := context.Background()
	s, err := Open(ctx, Options{Root: os.Getenv(envCrashRoot)})
	if err == nil {
		for _, op := range append(crashOps, snapshotCrashOps...) {
			if op.name == opName {
				err = op.run(ctx, s)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 3
	}
	return 0
}

// runCrashChild reports whether the child was killed before it finished.
func runCrashChild(t *testing.T, op, root string, at int) bool {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashOp+"="+op, envCrashRoot+"="+root, envCrashAt+"="+strconv.Itoa(at))
	out, err := cmd.CombinedOutput()
	if err == nil {
		return false
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		return true
	}
	t.Fatalf("crash child (%s at step %d) failed: %v\n%s", op, at, err, out)
	return false
}

type cacheState struct {
	generation int64
	layers     int
	view       map[string]string // nil when the cache does not exist
}

func observe(t *testing.T, s *Store) cacheState {
	t.Helper()
	info, err := s.Inspect(context.Background(), CacheRef{"ns", "c"})
	if err != nil {
		return cacheState{}
	}
	return cacheState{info.Generation, len(info.Layers), view(t, s, "ns/c")}
}

func (c cacheState) matches(o cacheState) bool {
	return c.generation == o.generation && c.layers == o.layers && (c.view == nil) == (o.view == nil) && diffSnapshots(c.view, o.view) == ""
}

func TestCrashAtEveryStep(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for _, op := range crashOps {
		t.Run(op.name, func(t *testing.T) {
			ref := newTestStore(t, Options{})
			op.setup(t, ref)
			before := observe(t, ref)
			must(t, op.run(ctx, ref))
			after := observe(t, ref)
			if before.matches(after) {
				t.Fatalf("%s changed nothing observable; the test would prove nothing", op.name)
			}
			crashes := 0
			for at := 1; at < 1000; at++ {
				s := newTestStore(t, Options{})
				op.setup(t, s)
				killed := runCrashChild(t, op.name, s.Root(), at)
				if got := observe(t, s); !got.matches(before) && !got.matches(after) {
					t.Fatalf("crash at step %d: cache is neither old (%+v) nor new (%+v): %+v", at, before, after, got)
				}
				if op.check != nil {
					op.check(t, s, ref)
				}
				if _, err := s.Recover(ctx); err != nil {
					t.Fatalf("crash at step %d: Recover: %v", at, err)
				}
				got := observe(t, s)
				if !got.matches(before) && !got.matches(after) {
					t.Fatalf("crash at step %d: after Recover the cache is neither old nor new: %+v", at, got)
				}
				if op.check != nil {
					op.check(t, s, ref)
				}
				if op.finish != nil {
					op.finish(t, s)
				} else {
					finishPending(t, s)
				}
				if got := observe(t, s); op.lands && !got.matches(after) {
					t.Fatalf("crash at step %d: the retried commit did not land: %+v", at, got)
				}
				if op.redo {
					if err := op.run(ctx, s); err != nil {
						t.Fatalf("crash at step %d: %s again after Recover: %v", at, op.name, err)
					}
					if got := observe(t, s); !got.matches(after) {
						t.Fatalf("crash at step %d: %s again after Recover did not reach the new state: %+v", at, op.name, got)
					}
				}
				assertNoOrphans(t, s)
				if !killed {
					break
				}
				crashes++
			}
			if crashes < 3 {
				t.Fatalf("only %d crash points exercised", crashes)
			}
			t.Logf("%s: recovered from a crash at each of %d steps", op.name, crashes)
		})
	}
}

// finishPending commits a volume whose commit never recorded its intent:
// it is still a mounted volume, and its upper layer must be intact.
func finishPending(t *testing.T, s *Store) {
	t.Helper()
	if _, err := s.Volume(context.Background(), "pending"); err == nil {
		mustCommit(t, s, "pending")
	}
}
