//go:build e2e && multinode

package multinode

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// snapshotClass copies the registry's class with the snapshot layout:
// caches of btrfs subvolumes that sync through the registry one whole
// generation at a time (issue 36). The node's store needs btrfs-progs,
// as config/'s snapshot class does.
func (e *syncEnv) snapshotClass(ctx context.Context) string {
	e.t.Helper()
	return e.derivedClass(ctx, "snapshot", map[string]string{"layout": "snapshot"})
}

// TestSnapshotCacheFollowsItsBuilds: a snapshot cache committed on node
// A is what the next build on node B sees, and B's commit, published
// after it, is what the next build on A sees: whole-volume last writer
// wins across nodes, in the chain's order.
func TestSnapshotCacheFollowsItsBuilds(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	class := e.snapshotClass(ctx)

	e.run(ctx, e.buildPod("snap-1", a, "snap", class, "echo a > /cache/a.txt; echo a > /cache/gone.txt"))
	e.waitPublished(ctx, "snap", 1)
	out := e.run(ctx, e.buildPod("snap-2", b, "snap", class, "cat /cache/a.txt; echo b > /cache/b.txt; rm /cache/gone.txt"))
	if got := strings.Fields(out); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("the build on %s read %q, want a (from %s)", b, out, a)
	}
	e.waitPublished(ctx, "snap", 2)
	out = e.run(ctx, e.buildPod("snap-3", a, "snap", class, "cat /cache/a.txt /cache/b.txt; test ! -e /cache/gone.txt && echo gone"))
	if got := strings.Fields(out); !slices.Equal(got, []string{"a", "b", "gone"}) {
		t.Fatalf("the build on %s read %q, want a, b and gone.txt removed (node %s's generation)", a, out, b)
	}
}

// TestSnapshotCacheSeedsFromMainAcrossNodes: main, a snapshot cache, is
// built on node A; pr-1's first build, on node B with fallback main,
// starts from main's files (node B pulls main's generation and
// snapshots it); its commit publishes pr-1's own generation, which
// pr-1's next build, on node A, sees.
func TestSnapshotCacheSeedsFromMainAcrossNodes(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	class := e.snapshotClass(ctx)

	e.run(ctx, e.buildPod("main-1", a, "main", class, "echo one > /cache/main1.txt"))
	e.waitPublished(ctx, "main", 1)

	out := e.run(ctx, withFallback(e.buildPod("pr-first", b, "pr-1", class, "cat /cache/main1.txt; echo pr > /cache/pr.txt"), "main"))
	if got := strings.Fields(out); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("pr-1's first build on %s read %q, want main's file (one)", b, out)
	}
	e.waitEvent(ctx, "PersistentVolumeClaim", "pr-first-cache", "SeededFromFallback", "starts from fallback "+e.Namespace+"/main at generation 1")
	pub := e.waitPublished(ctx, "pr-1", 1).Status.Published
	if want := e.Reg.Repository + "/" + e.Namespace + "/pr-1"; pub.Repository != want || pub.Layers[0].Node != b {
		t.Fatalf("pr-1's chain in %s, newest from %s: want %s's generation in %s", pub.Repository, pub.Layers[0].Node, b, want)
	}

	out = e.run(ctx, e.buildPod("pr-next", a, "pr-1", class, "cat /cache/main1.txt /cache/pr.txt"))
	if got := strings.Fields(out); !slices.Equal(got, []string{"one", "pr"}) {
		t.Fatalf("pr-1's next build on %s read %q, want main's file and pr-1's (one, pr)", a, out)
	}
}
