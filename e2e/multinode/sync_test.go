//go:build e2e && multinode

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

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
)

// The scenarios of caches across nodes: a build on one node warms the
// next build on the other, concurrent builds on both land and both nodes
// converge, a registry outage and node agents killed mid-push and
// mid-pull lose nothing, and bad credentials are an Event that names the
// Secret and the registry.

// TestBuildOnOneNodeWarmsTheOther: what a build commits on node A is in
// the next build's volume on node B, through the registry.
func TestBuildOnOneNodeWarmsTheOther(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)

	e.run(ctx, e.buildPod("build-a", a, "maven", "", "mkdir -p /cache/repo && echo 'artifact from A' > /cache/repo/lib.jar"))
	c := e.waitPublished(ctx, "maven", 1)
	pub := c.Status.Published
	if want := e.Reg.Repository + "/" + e.Namespace + "/maven"; pub.Repository != want || pub.Layers[0].Node != a {
		t.Errorf("published chain %+v: want repository %s and the layer from %s", pub, want, a)
	}
	out := e.run(ctx, e.buildPod("build-b", b, "maven", "", "cat /cache/repo/lib.jar"))
	if strings.TrimSpace(out) != "artifact from A" {
		t.Fatalf("the build on %s read %q, want A's artifact", b, out)
	}
	e.waitCache(ctx, "maven", time.Minute, b+" reporting generation 1", func(c *v1alpha1.Cache) bool {
		n := e.nodeEntry(c, b)
		return n != nil && n.Generation >= 1
	})
}

// TestConcurrentBuildsOnTwoNodesConverge: two builds of one cache, one on
// each node, at once. Both commits land, one after the other in the
// Cache's chain, and both nodes then show the same merged view.
func TestConcurrentBuildsOnTwoNodesConverge(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	script := func(who string) string {
		return fmt.Sprintf("until [ -e /tmp/go ]; do sleep 0.2; done; echo %s > /cache/%s.txt; echo %s > /cache/shared.txt", who, who, who)
	}
	for _, p := range []struct{ name, node, who string }{{"on-a", a, "a"}, {"on-b", b, "b"}} {
		if _, err := e.CreatePod(ctx, e.buildPod(p.name, p.node, "npm", "", script(p.who))); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"on-a", "on-b"} {
		if _, err := e.WaitForPodPhase(ctx, name, "Running"); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"on-a", "on-b"} { // both have mounted the empty cache
		if _, _, err := e.Exec(ctx, name, "main", "touch", "/tmp/go"); err != nil {
			t.Fatal(err)
		}
	}
	e.waitSucceeded(ctx, "on-a")
	e.waitSucceeded(ctx, "on-b")
	c := e.waitPublished(ctx, "npm", 2)
	pub := c.Status.Published
	if len(pub.Layers) != 2 || pub.Layers[0].Node == pub.Layers[1].Node {
		t.Fatalf("published chain %+v: want one layer from each node", pub)
	}
	winner := map[string]string{a: "a", b: "b"}[pub.Layers[0].Node]
	for i, node := range []string{a, b} {
		out := e.run(ctx, e.buildPod(fmt.Sprintf("check-%d", i), node, "npm", "", "cat /cache/a.txt /cache/b.txt /cache/shared.txt"))
		if got, want := strings.Fields(out), []string{"a", "b", winner}; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("node %s sees %q, want %q (both files, and the newer layer's shared.txt)", node, got, want)
		}
	}
}

// TestBadCredentialsAreAnEvent: a StorageClass whose Secret holds a wrong
// password. The build still succeeds and commits on its node; pushing is
// refused, and a Warning Event on the Cache names the registry and the
// Secret.
func TestBadCredentialsAreAnEvent(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	class := e.badCredentialsClass(ctx)
	e.run(ctx, e.buildPod("build", e.node(0), "gradle", class, "echo x > /cache/x"))
	e.waitEvent(ctx, "Cache", "gradle", "RegistryFailed", e.Reg.Address, `Secret "`+e.Reg.BadSecret+`"`, "refused the credentials")
	c := e.waitCache(ctx, "gradle", time.Minute, "the lag showing", func(c *v1alpha1.Cache) bool {
		n := e.nodeEntry(c, e.node(0))
		return n != nil && n.Generation == 1 && n.Unpublished == 1
	})
	if c.Status.Published.Generation != 0 {
		t.Errorf("chain %+v advanced although the registry refused the push", c.Status.Published)
	}
}

// badCredentialsClass copies the registry's class with the Secret of the
// wrong password; it is deleted with the test.
func (e *syncEnv) badCredentialsClass(ctx context.Context) string {
	e.t.Helper()
	good, err := e.Client.StorageV1().StorageClasses().Get(ctx, e.Reg.StorageClass, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	bad := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: e.Namespace + "-bad-creds"},
		Provisioner:       good.Provisioner,
		Parameters:        map[string]string{},
		VolumeBindingMode: good.VolumeBindingMode,
		ReclaimPolicy:     good.ReclaimPolicy,
	}
	for k, v := range good.Parameters {
		bad.Parameters[k] = v
	}
	bad.Parameters["registrySecret"] = e.Reg.BadSecret
	if _, err := e.Client.StorageV1().StorageClasses().Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		e.Client.StorageV1().StorageClasses().Delete(context.Background(), bad.Name, metav1.DeleteOptions{})
	})
	return bad.Name
}

// TestRegistryOutageLosesNothing stops the registry while a build runs.
// The build succeeds and commits on its node; the Cache shows the layer
// unpublished and a Warning Event; a build on the other node meanwhile
// mounts what its node has. Once the registry is back the layer is pushed
// without anyone's help, and the other node gets it. It stops the
// registry, so it does not run in parallel.
func TestRegistryOutageLosesNothing(t *testing.T) {
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if err := e.Cluster.StartRegistry(context.Background()); err != nil {
				t.Errorf("restart the registry after the test: %v", err)
			}
		}
	})

	if _, err := e.CreatePod(ctx, e.buildPod("build", a, "go", "", "until [ -e /tmp/go ]; do sleep 0.2; done; echo 'through the outage' > /cache/kept")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitForPodPhase(ctx, "build", "Running"); err != nil {
		t.Fatal(err)
	}
	if err := e.Cluster.StopRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Exec(ctx, "build", "main", "touch", "/tmp/go"); err != nil {
		t.Fatal(err)
	}
	e.waitSucceeded(ctx, "build")
	e.waitEvent(ctx, "Cache", "go", "RegistryFailed", e.Reg.Address, "stay on node "+a)
	e.waitCache(ctx, "go", time.Minute, "node A reporting its unpublished layer", func(c *v1alpha1.Cache) bool {
		n := e.nodeEntry(c, a)
		return n != nil && n.Generation == 1 && n.Unpublished == 1
	})
	out := e.run(ctx, e.buildPod("during", b, "go", "", "cat /cache/kept 2>/dev/null || echo cold"))
	if strings.TrimSpace(out) != "cold" {
		t.Errorf("a build on %s during the outage read %q, want a cold cache", b, out)
	}
	// It mounted without node A's announced layer, and says so.
	e.waitEvent(ctx, "PersistentVolumeClaim", "during-cache", "SyncIncomplete", "generation 1 from node "+a)

	if err := e.Cluster.StartRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	e.waitPublished(ctx, "go", 1)
	e.waitEvent(ctx, "Cache", "go", "Published", a)
	out = e.run(ctx, e.buildPod("after", b, "go", "", "cat /cache/kept"))
	if strings.TrimSpace(out) != "through the outage" {
		t.Errorf("a build on %s after the outage read %q, want the build's file", b, out)
	}
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

	if _, err := e.CreatePod(ctx, e.buildPod("reader", b, "ccache", "", "sha256sum /cache/big | cut -d' ' -f1; cat /cache/big.sha256")); err != nil {
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
