//go:build e2e && multinode

package multinode

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestKeptPodsOfASyncedCacheAreQuiet: a build on node A commits and
// publishes, a build on node B reads it, and both completed pods are kept,
// as users keep Job pods for hours. Once settled, nothing writes to the
// namespace for 3 minutes: the Cache (its chain and announcements), its
// CacheReplicas, claims, PVs and Events stay as they are.
func TestKeptPodsOfASyncedCacheAreQuiet(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	e.run(ctx, e.buildPod("writer", a, "kept", "", "echo built > /cache/out"))
	out := e.run(ctx, e.buildPod("reader", b, "kept", "", "cat /cache/out"))
	if strings.TrimSpace(out) != "built" {
		t.Fatalf("the reader on %s read %q, want the writer's output", b, out)
	}
	e.waitPublished(ctx, "kept", 1)
	e.ExpectQuiet(ctx, 2*time.Minute, 3*time.Minute)
}
