package layerfs

import (
	"context"
	"path/filepath"
	"testing"
)

// The snapshot layout's crash points (see crash_test.go for the harness):
// a volume's subvolume made before its record, a generation made before
// the head names it, the head swapped before the volume's subvolume and
// the old generation are deleted, and deletions themselves. After each
// crash and Recover the cache is its old or its new generation, and no
// subvolume is left that nothing names.
var snapshotCrashOps = []crashOp{
	{
		name: "snapshot-commit",
		setup: func(t testing.TB, s *Store) {
			buildSnapshot(t, s, "base", "ns/c", map[string]string{"a": "1", "b": "1"})
			v := mountSnapshot(t, s, "pending", "ns/c", MountOptions{})
			writeFile(t, filepath.Join(v.MergedPath, "a"), "2")
			writeFile(t, filepath.Join(v.MergedPath, "new", "f"), "3")
			writeFile(t, filepath.Join(v.MergedPath, ControlDir, "commit"), "")
			fixTimes(t, v.MergedPath)
		},
		run: func(ctx context.Context, s *Store) error {
			_, err := s.Commit(ctx, "pending")
			return err
		},
	},
	{
		name: "snapshot-remove",
		setup: func(t testing.TB, s *Store) {
			buildSnapshot(t, s, "base", "ns/c", map[string]string{"a": "1"})
		},
		run: func(ctx context.Context, s *Store) error { return s.Remove(ctx, CacheRef{"ns", "c"}) },
	},
	{
		// A mount changes no cache; what matters is that a crash leaves
		// no subvolume behind and the volume, if recorded, works.
		name: "snapshot-mount",
		setup: func(t testing.TB, s *Store) {
			buildSnapshot(t, s, "base", "ns/c", map[string]string{"a": "1"})
		},
		run: func(ctx context.Context, s *Store) error {
			_, err := s.Mount(ctx, "pending", MountOptions{Cache: CacheRef{"ns", "c"}, Layout: LayoutSnapshot})
			return err
		},
	},
	{
		name: "snapshot-discard",
		setup: func(t testing.TB, s *Store) {
			buildSnapshot(t, s, "base", "ns/c", map[string]string{"a": "1"})
			v := mountSnapshot(t, s, "pending", "ns/c", MountOptions{})
			writeFile(t, filepath.Join(v.MergedPath, "a"), "2")
		},
		run: func(ctx context.Context, s *Store) error { return s.Discard(ctx, "pending") },
	},
}

func TestSnapshotCrashAtEveryStep(t *testing.T) {
	requireBtrfs(t)
	for _, op := range snapshotCrashOps {
		for _, kind := range snapshotRoots {
			t.Run(op.name+"/"+kind, func(t *testing.T) { crashSnapshotOp(t, op, kind) })
		}
	}
}

// crashSnapshotOp kills op at each of its steps in turn on a store of
// the given kind of root, and checks what Recover makes of it.
func crashSnapshotOp(t *testing.T, op crashOp, kind string) {
	ctx := context.Background()
	ref := newSnapshotStore(t, kind)
	op.setup(t, ref)
	before := observe(t, ref)
	must(t, op.run(ctx, ref))
	after := observe(t, ref)
	crashes := 0
	for at := 1; at < 200; at++ {
		s := newSnapshotStore(t, kind)
		op.setup(t, s)
		killed := runCrashChild(t, op.name, s.Root(), at)
		if got := observe(t, s); !got.matches(before) && !got.matches(after) {
			t.Fatalf("crash at step %d: cache is neither old (%+v) nor new (%+v): %+v", at, before, after, got)
		}
		if _, err := s.Recover(ctx); err != nil {
			t.Fatalf("crash at step %d: Recover: %v", at, err)
		}
		if got := observe(t, s); !got.matches(before) && !got.matches(after) {
			t.Fatalf("crash at step %d: after Recover the cache is neither old nor new: %+v", at, got)
		}
		finishPending(t, s)
		if got := observe(t, s); op.name == "snapshot-commit" && !got.matches(after) {
			t.Fatalf("crash at step %d: the retried commit did not land: %+v", at, got)
		}
		assertNoOrphans(t, s)
		if !killed {
			break
		}
		crashes++
	}
	if crashes < 2 {
		t.Fatalf("only %d crash points exercised", crashes)
	}
	t.Logf("%s (%s root): recovered from a crash at each of %d steps", op.name, kind, crashes)
}
