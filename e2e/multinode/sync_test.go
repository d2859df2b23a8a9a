//go:build e2e && multinode

package multinode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
	return e.derivedClass(ctx, "bad-creds", map[string]string{"registrySecret": e.Reg.BadSecret})
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
