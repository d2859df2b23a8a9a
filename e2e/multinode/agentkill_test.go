//go:build e2e && multinode && faults

package multinode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
)

// The two-node scenarios that SIGKILL node agents (build tag faults as
// well): node A is node 1, where the one-node scenarios run, so make e2e
// runs these alone with the other faults (make e2e-faults), after every
// package.

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

// TestAgentKilledMidPushAndMidPull kills node agents with SIGKILL while
// they move a 256 MiB layer: node A's right after the build's commit,
// while it pushes; node B's while it pulls for a new claim. Each agent
// restarts (its DaemonSet), recovers its store and finishes the job:
// the layer is published once, node B's build sees it, and node B's store
// keeps no temp files.
func TestAgentKilledMidPushAndMidPull(t *testing.T) {
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	e.run(ctx, e.buildPod("build", a, "ccache", "",
		"head -c 268435456 /dev/urandom > /cache/big && sha256sum /cache/big | cut -d' ' -f1 > /cache/big.sha256"))
	before := e.killAgent(ctx, a, "ccache")
	t.Logf("killed %s's agent %s after the build; chain then: %v", a, before.pid, before.published)
	c := e.waitPublished(ctx, "ccache", 1)
	if n := len(c.Status.Published.Layers); n != 1 {
		t.Errorf("chain has %d layers after the restart, want the one layer published once: %+v", n, c.Status.Published)
	}

	// A whole pull, so that the kill hits a pull (a layer mounted first is
	// fetched by the build's reads: TestAgentKilledDuringALazyBuild).
	whole := e.wholePullClass(ctx)
	if _, err := e.CreatePod(ctx, e.buildPod("reader", b, "ccache", whole, "sha256sum /cache/big | cut -d' ' -f1; cat /cache/big.sha256")); err != nil {
		t.Fatal(err)
	}
	e.waitPulling(ctx, b)
	killed := e.killAgent(ctx, b, "ccache")
	t.Logf("killed %s's agent %s during the pull", b, killed.pid)
	out := e.waitSucceeded(ctx, "reader")
	if sums := strings.Fields(out); len(sums) != 2 || sums[0] != sums[1] {
		t.Errorf("node %s's copy of the 256 MiB file: sha256 %q, want it equal to the build's", b, sums)
	}
	e.expectNoTemp(ctx, b)
}

type killed struct {
	pid       string
	published *v1alpha1.PublishedChain
}

// killAgent sends SIGKILL to node's agent and returns its PID and the
// chain of Cache cache at that moment.
func (e *syncEnv) killAgent(ctx context.Context, node, cache string) killed {
	e.t.Helper()
	pid, err := agentPID(node)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		e.t.Fatalf("kill -9 %d (%s's agent): %v", pid, node, err)
	}
	c, _ := e.cache(ctx, cache)
	return killed{pid: strconv.Itoa(pid), published: c.Status.Published}
}

// agentPID finds node's agent among the host's processes: the local
// cluster's nodes share the host's PID namespace.
func agentPID(node string) (int, error) {
	procs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !bytes.Contains(cmd, []byte("layercache\x00node\x00")) {
			continue
		}
		env, err := os.ReadFile(filepath.Join(p, "environ"))
		if err == nil && bytes.Contains(env, []byte("\x00NODE_NAME="+node+"\x00")) {
			return strconv.Atoi(filepath.Base(p))
		}
	}
	return 0, fmt.Errorf("no node agent process of node %s on this host (the local backend runs them here)", node)
}

// waitPulling waits until node's store has a layer being unpacked.
func (e *syncEnv) waitPulling(ctx context.Context, node string) {
	e.t.Helper()
	n, err := e.Cluster.Node(node)
	if err != nil {
		e.t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		entries, _ := os.ReadDir(filepath.Join(n.HostRoot, "tmp"))
		for _, en := range entries {
			if strings.HasPrefix(en.Name(), "pull-") || strings.HasPrefix(en.Name(), "new-") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("node %s never started unpacking a pulled layer: %v", node, err)
	}
}

// expectNoTemp checks that node's store has no temp dirs left.
func (e *syncEnv) expectNoTemp(ctx context.Context, node string) {
	e.t.Helper()
	n, err := e.Cluster.Node(node)
	if err != nil {
		e.t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(n.HostRoot, "tmp"))
	if err != nil {
		e.t.Fatal(err)
	}
	for _, en := range entries {
		if strings.HasPrefix(en.Name(), "pull-") || strings.HasPrefix(en.Name(), "new-") {
			e.t.Errorf("node %s's store keeps temp %s after the pull", node, en.Name())
		}
	}
}
