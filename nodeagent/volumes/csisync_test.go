package volumes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// The tests in this file run CSI inline volumes of a registry class on
// the two nodes of a syncCluster (sync_test.go): real stores, one
// in-process registry, the kubelet's calls made as it makes them.

// serveCSI makes every node of c serve CSI volumes, in namespace ci,
// which has opted in, with Events that name their subject. Each node's
// kubelet directory outlives its agent's restarts.
func (c *syncCluster) serveCSI(t *testing.T) {
	t.Helper()
	ci := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ci", Labels: map[string]string{v1alpha1.LabelCSI: v1alpha1.CSIEnabled}}}
	must(t, c.client.Create(context.Background(), ci))
	c.kubeletDirs = map[string]string{}
	for name, n := range c.nodes {
		c.kubeletDirs[name] = t.TempDir()
		dir := c.kubeletDirs[name]
		t.Cleanup(func() { unmountUnder(t, dir) })
		c.startCSIAgent(t, name, n.store)
	}
}

// startCSIAgent starts node's agent over st, serving CSI volumes.
func (c *syncCluster) startCSIAgent(t *testing.T, name string, st *layerfs.Store) *syncNode {
	t.Helper()
	return c.startAgentWith(t, name, st, func(p *nodeParts) {
		p.core.KubeletDir = c.kubeletDirs[name]
		pods := p.core.Pods.GetIndexer()
		p.core.GetPod = func(_ context.Context, ns, pod string) (*corev1.Pod, error) {
			obj, ok, _ := pods.GetByKey(ns + "/" + pod)
			if !ok {
				return nil, apierrors.NewNotFound(corev1.Resource("pods"), pod)
			}
			return obj.(*corev1.Pod), nil
		}
		rec := subjectRecorder{p.core.Events}
		p.core.Events, p.sync.Events = rec, rec
	})
}

// subjectRecorder appends to each Event the object it is on, so that a
// test tells the pod's Events from the Cache's.
type subjectRecorder struct{ events.EventRecorder }

func (r subjectRecorder) Eventf(regarding, related runtime.Object, typ, reason, action, note string, args ...any) {
	on := fmt.Sprintf("%T", regarding)
	if o, ok := regarding.(interface {
		GetNamespace() string
		GetName() string
	}); ok {
		on = fmt.Sprintf("%s %s/%s", on, o.GetNamespace(), o.GetName())
	}
	r.EventRecorder.Eventf(regarding, related, typ, reason, action, "%s [on %s]", fmt.Sprintf(note, args...), on)
}

// csiPublish publishes the volume of pod (running on node) with attrs and
// returns its target.
func (c *syncCluster) csiPublish(t *testing.T, node, pod string, attrs map[string]string) string {
	t.Helper()
	n := c.nodes[node]
	must(t, n.pods.Add(csiPodObject(pod, corev1.PodRunning)))
	req := csiPublishRequest(c.kubeletDirs[node], pod, attrs)
	if _, err := n.csi.NodePublishVolume(context.Background(), req); err != nil {
		t.Fatalf("publish %s on %s: %v", pod, node, err)
	}
	return req.TargetPath
}

// csiEnd ends pod's build as succeeded, as the kubelet does (unpublish),
// and publishes as the agent's queue would.
func (c *syncCluster) csiEnd(t *testing.T, node, pod string) {
	t.Helper()
	n := c.nodes[node]
	must(t, n.pods.Update(csiPodObject(pod, corev1.PodSucceeded)))
	_, err := n.csi.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-" + pod, TargetPath: csiTarget(c.kubeletDirs[node], pod)})
	if err != nil {
		t.Fatalf("unpublish %s on %s: %v", pod, node, err)
	}
	if err := n.sync.Publish(context.Background(), maven); err != nil {
		t.Fatalf("publish the commit of %s on %s: %v", pod, node, err)
	}
}

// registryAttrs are a CSI volume of cache maven of the registry class.
var registryAttrs = map[string]string{kit.AttrCache: "maven", kit.AttrStorageClass: "layercache"}

func wantTargetFile(t *testing.T, target, name, content string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(target, name))
	if err != nil || string(got) != content {
		t.Errorf("%s in %s = %q, %v; want %q", name, target, got, err, content)
	}
}

// Issue 36: a CSI volume of a registry class follows its builds across
// nodes, as a claim does, and claims and CSI volumes share one chain.
func TestSyncCSIVolumesFollowTheirBuilds(t *testing.T) {
	c := newSyncCluster(t)
	c.serveCSI(t)
	a, b := c.nodes["node-a"], c.nodes["node-b"]

	onA := c.csiPublish(t, "node-a", "build-a", registryAttrs)
	writeTestFile(t, filepath.Join(onA, "from-a.txt"), "built on a")
	c.csiEnd(t, "node-a", "build-a")
	if pub := c.published(t); pub == nil || pub.Generation != 1 || len(pub.Layers) != 1 || pub.Layers[0].Node != "node-a" ||
		pub.Repository != c.reg.Host+"/caches/ci/maven" || pub.Secret != registrySecret {
		t.Fatalf("published chain %+v: want generation 1, one layer from node-a in %s/caches/ci/maven", pub, c.reg.Host)
	}
	wantEvents(t, a, "Normal "+kit.ReasonCommitted, 1, "as generation 1 of cache ci/maven", "[on *v1.Pod ci/build-a]")

	onB := c.csiPublish(t, "node-b", "build-b", registryAttrs)
	wantTargetFile(t, onB, "from-a.txt", "built on a")
	writeTestFile(t, filepath.Join(onB, "from-b.txt"), "built on b")
	c.csiEnd(t, "node-b", "build-b")
	if pub := c.published(t); pub.Generation != 2 || len(pub.Layers) != 2 || pub.Layers[0].Node != "node-b" {
		t.Fatalf("published chain %+v: want node-b's layer on node-a's", pub)
	}
	wantEvents(t, b, "Normal "+kit.ReasonCommitted, 1, "as generation 2 of cache ci/maven", "[on *v1.Pod ci/build-b]")

	pv := c.provision(t, "node-a", "check")
	wantFile(t, pv, "from-a.txt", "built on a")
	wantFile(t, pv, "from-b.txt", "built on b")
}

// The end of a CSI volume of a registry class needs nothing the agent
// kept in memory: a restarted agent commits and publishes it.
func TestSyncCSIVolumeEndsAfterAnAgentRestart(t *testing.T) {
	c := newSyncCluster(t)
	c.serveCSI(t)
	target := c.csiPublish(t, "node-a", "build", registryAttrs)
	writeTestFile(t, filepath.Join(target, "kept.txt"), "across the restart")

	c.startCSIAgent(t, "node-a", c.nodes["node-a"].store)
	c.csiEnd(t, "node-a", "build")
	if pub := c.published(t); pub == nil || pub.Generation != 1 || len(pub.Layers) != 1 || pub.Layers[0].Node != "node-a" {
		t.Fatalf("published chain %+v: want the restarted agent's commit published", pub)
	}
	onB := c.csiPublish(t, "node-b", "reader", registryAttrs)
	wantTargetFile(t, onB, "kept.txt", "across the restart")
}

// A pull that fails is an Event on the CSI volume's pod, as on a claim,
// and the volume mounts what the node has.
func TestSyncCSIPullFailureIsAnEventOnThePod(t *testing.T) {
	c := newSyncCluster(t)
	c.serveCSI(t)
	target := c.csiPublish(t, "node-a", "build", registryAttrs)
	writeTestFile(t, filepath.Join(target, "a.txt"), "a")
	c.csiEnd(t, "node-a", "build")

	c.reg.SetDown(true)
	cold := c.csiPublish(t, "node-b", "during-outage", registryAttrs)
	if _, err := os.Stat(filepath.Join(cold, "a.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a.txt on node-b during the outage: %v, want none (mounts what the node has)", err)
	}
	wantEvents(t, c.nodes["node-b"], "Warning "+kit.ReasonRegistryFailed, 1, "could not bring cache ci/maven up to date", "[on *v1.Pod ci/during-outage]")
}
