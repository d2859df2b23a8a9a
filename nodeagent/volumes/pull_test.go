package volumes

import (
	"context"
	"testing"
	"time"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/nodeagent/kit"
)

func TestSyncPullFailureMountsWhatTheNodeHas(t *testing.T) {
	c := newSyncCluster(t)
	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "x.txt", "x")
	if err := c.commit(t, "node-a", pv); err != nil {
		t.Fatal(err)
	}
	c.reg.SetDown(true)
	b := c.nodes["node-b"]
	cold := c.provision(t, "node-b", "cold")
	wantNoFile(t, cold, "x.txt")
	wantEvents(t, b, "Warning "+kit.ReasonRegistryFailed, 1, "mounts what node node-b has")
}

func TestSyncPullPastTheTimeoutMountsWhatTheNodeHas(t *testing.T) {
	c := newSyncCluster(t)
	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "x.txt", "x")
	if err := c.commit(t, "node-a", pv); err != nil {
		t.Fatal(err)
	}
	c.reg.SetDelay(3 * time.Second)
	b := c.nodes["node-b"]
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "maven"},
		map[string]string{kit.ParamRegistry: c.reg.Host + "/caches", kit.ParamRegistrySecret: registrySecret, kit.ParamSyncTimeout: "300ms"})
	opts.SelectedNodeName, opts.PVC.Annotations[kit.AnnSelectedNode] = "node-b", "node-b"
	start := time.Now()
	cold, _, err := b.prov.Provision(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("Provision waited %s, past the class's syncTimeout of 300ms", waited)
	}
	wantNoFile(t, cold, "x.txt")
	wantEvents(t, b, "Warning "+kit.ReasonSyncIncomplete, 1, "syncTimeout of 300ms", "mounts what the node has")
}
