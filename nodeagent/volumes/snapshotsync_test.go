package volumes

import (
	"context"
	"testing"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

// snapshotClass makes the cluster's registry class one of the snapshot
// layout and returns the parameters its claims are provisioned with.
func (c *syncCluster) snapshotClass(t *testing.T) map[string]string {
	t.Helper()
	c.layout = layerfs.LayoutSnapshot
	c.addClass(t, kittest.Class(c.params()))
	return map[string]string{kit.ParamLayout: string(layerfs.LayoutSnapshot)}
}

// A snapshot cache crosses nodes through the registry as an overlay
// cache does, each commit a whole generation; two writers on two nodes
// keep the layout's rule, whole-volume last writer wins, in the order
// their generations reach the chain.
func TestSyncSnapshotCacheReachesTheOtherNode(t *testing.T) {
	c := newSyncCluster(t)
	snap := c.snapshotClass(t)
	first := c.provisionWith(t, "node-a", "build-1", snap)
	writeFile(t, first, "from-a.txt", "built on a")
	if err := c.commit(t, "node-a", first); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if pub := c.published(t); pub == nil || pub.Generation != 1 || len(pub.Layers) != 1 || pub.Layers[0].Node != "node-a" {
		t.Fatalf("published chain %+v: want generation 1, one layer from node-a", pub)
	}
	onB := c.provisionWith(t, "node-b", "build-2", snap)
	wantFile(t, onB, "from-a.txt", "built on a")
	if info, err := c.nodes["node-b"].store.Inspect(t.Context(), maven); err != nil || info.Layout != layerfs.LayoutSnapshot {
		t.Fatalf("node-b's cache: %+v, %v; want the snapshot layout", info, err)
	}

	// Two writers from generation 1: node-a's reaches the chain first,
	// node-b's after it, so node-b's whole volume is the cache.
	onA := c.provisionWith(t, "node-a", "build-3", snap)
	writeFile(t, onA, "only-a.txt", "a")
	writeFile(t, onB, "only-b.txt", "b")
	if err := c.commit(t, "node-a", onA); err != nil {
		t.Fatalf("publish on node-a: %v", err)
	}
	if err := c.commit(t, "node-b", onB); err != nil {
		t.Fatalf("publish on node-b: %v", err)
	}
	// The newest generation is the whole cache: the chain folds into it.
	if pub := c.published(t); pub.Generation != 3 || len(pub.Layers) != 1 || pub.Layers[0].Node != "node-b" || len(pub.Layers[0].Covers) != 2 {
		t.Fatalf("published chain %+v: want generation 3, one layer from node-b that covers the two before", pub)
	}
	for _, node := range []string{"node-a", "node-b"} {
		v := c.provisionWith(t, node, "view-"+node, snap)
		wantFile(t, v, "only-b.txt", "b")
		wantFile(t, v, "from-a.txt", "built on a")
		wantNoFile(t, v, "only-a.txt")
	}
}

// TestSeedSnapshotAcrossNodes: main, a snapshot cache, is built on
// node-a; pr-1's first build, on node-b, starts from main's generation,
// pulled as a read of main would be and snapshotted, and its commit
// publishes pr-1's own generation.
func TestSeedSnapshotAcrossNodes(t *testing.T) {
	c := newSyncCluster(t)
	c.snapshotClass(t)
	c.build(t, "node-a", "main-1", ciMain, nil, "main.txt")
	fallback := map[string]string{v1alpha1.AnnotationFallback: "main"}
	pr := c.provisionCache(t, "node-b", "pr-a", "pr-1", fallback)
	if got := pr.Annotations[v1alpha1.AnnotationSeededFrom]; got != "ci/main@1" {
		t.Errorf("PV annotation %s = %q, want ci/main@1", v1alpha1.AnnotationSeededFrom, got)
	}
	wantFile(t, pr, "main.txt", "main.txt from main-1")
	writeFile(t, pr, "pr.txt", "pr")
	c.end(t, "node-b", pr)
	if err := c.nodes["node-b"].sync.Publish(context.Background(), ciPR1); err != nil {
		t.Fatalf("publish pr-1: %v", err)
	}
	pub := c.chainOf(t, ciPR1)
	if pub == nil || len(pub.Layers) != 1 || pub.Repository != c.reg.Host+"/caches/ci/pr-1" {
		t.Fatalf("pr-1's chain %+v: want its one generation in %s/caches/ci/pr-1", pub, c.reg.Host)
	}
	onA := c.provisionCache(t, "node-a", "pr-view", "pr-1", nil)
	wantFile(t, onA, "main.txt", "main.txt from main-1")
	wantFile(t, onA, "pr.txt", "pr")
}
