//go:build e2e && multinode

package multinode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// deltaScript writes a 512 MiB delta and a mark: publishing it takes
// seconds, long enough that a reader created when the writer ends would
// miss it without the announcement.
func deltaScript(mark string) string {
	return "head -c 536870912 /dev/urandom > /cache/delta; echo " + mark + " > /cache/mark"
}

// TestTheNextBuildSeesTheLastCommitOnAnyNode: ten times, a writer on node
// A ends with a 512 MiB delta and a reader is created on node B the
// moment the writer's pod has succeeded. Each reader sees its writer's
// commit.
func TestTheNextBuildSeesTheLastCommitOnAnyNode(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	const rounds = 10
	seen := 0
	for i := 1; i <= rounds; i++ {
		mark := fmt.Sprint(i)
		e.run(ctx, e.buildPod("writer-"+mark, a, "handoff", "", deltaScript(mark)))
		start := time.Now()
		out := e.run(ctx, e.buildPod("reader-"+mark, b, "handoff", "", "cat /cache/mark"))
		if got := strings.TrimSpace(out); got == mark {
			seen++
		} else {
			t.Errorf("round %d: the reader on %s read mark %q, want %q: it mounted without the commit that had ended on %s", i, b, got, mark, a)
		}
		t.Logf("round %d: reader created to done in %v", i, time.Since(start).Round(10*time.Millisecond))
	}
	t.Logf("%d of %d readers saw the last commit", seen, rounds)
	if c, err := e.cache(ctx, "handoff"); err == nil && c.Status.Published != nil && len(c.Status.Published.Announced) > 0 {
		t.Errorf("announcements left after every commit was read: %+v", c.Status.Published.Announced)
	}
}
