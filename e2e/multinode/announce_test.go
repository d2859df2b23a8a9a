//go:build e2e && multinode

package multinode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
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

// TestAnAnnouncedLayerArrivesAfterTheAgentReturns kills node A's agent
// between its announcement of a commit and the append of the layer. A
// reader on node B waits for it, within the class's syncTimeout; the
// restarted agent publishes the layer, and a later reader sees it.
func TestAnAnnouncedLayerArrivesAfterTheAgentReturns(t *testing.T) {
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	if _, err := e.CreatePod(ctx, e.buildPod("writer", a, "revived", "", deltaScript("revived"))); err != nil {
		t.Fatal(err)
	}
	// Kill the agent the moment its announcement is in the chain.
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := e.cache(ctx, "revived")
		return err == nil && announced(c, a), nil
	})
	if err != nil {
		t.Fatalf("node %s never announced the writer's commit: %v", a, err)
	}
	killed := e.killAgent(ctx, a, "revived")
	if len(killed.published.Layers) > 0 {
		t.Fatalf("the layer was already published when %s's agent was killed (chain %+v); the scenario needs the kill before the append", a, killed.published)
	}
	t.Logf("killed %s's agent %s after it announced %+v", a, killed.pid, killed.published.Announced)

	start := time.Now()
	out := e.run(ctx, e.buildPod("reader", b, "revived", "", "cat /cache/mark 2>/dev/null || echo cold"))
	t.Logf("the reader on %s read %q after %v", b, strings.TrimSpace(out), time.Since(start).Round(time.Second))
	if strings.TrimSpace(out) != "revived" {
		// It waited its syncTimeout for the agent and says what it lacks.
		e.waitEvent(ctx, "PersistentVolumeClaim", "reader-cache", "SyncIncomplete", "generation 1 from node "+a)
	}
	c := e.waitPublished(ctx, "revived", 1)
	if len(c.Status.Published.Announced) != 0 {
		t.Errorf("the announcement stayed after the layer was published: %+v", c.Status.Published)
	}
	out = e.run(ctx, e.buildPod("later", b, "revived", "", "cat /cache/mark"))
	if strings.TrimSpace(out) != "revived" {
		t.Errorf("a later reader on %s read %q, want the writer's mark", b, out)
	}
}

// announced tells whether the chain announces a layer of node.
func announced(c *v1alpha1.Cache, node string) bool {
	if c.Status.Published == nil {
		return false
	}
	for _, a := range c.Status.Published.Announced {
		if a.Node == node {
			return true
		}
	}
	return false
}
