package volumes

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/nodeagent/kit"
)

// Read-your-writes across nodes: two agents over real stores, one API and
// one registry, as in sync_test.go.

// end ends the PV's build as succeeded on node, as the build-end watcher
// does: commit and announce, with the publish only queued.
func (c *syncCluster) end(t testing.TB, node string, pv *corev1.PersistentVolume) {
	t.Helper()
	pv.Annotations[v1alpha1.AnnotationPodOutcome] = v1alpha1.OutcomeSucceeded
	pv.Status.Phase = corev1.VolumeReleased
	if err := c.nodes[node].prov.Delete(context.Background(), pv); err != nil {
		t.Fatalf("Delete %s on %s: %v", pv.Name, node, err)
	}
}

func TestAReaderWaitsForTheCommitAnnouncedOnAnotherNode(t *testing.T) {
	c := newSyncCluster(t)
	// The cache is published once, so node-b has it at generation 1.
	first := c.provision(t, "node-a", "first")
	writeFile(t, first, "gen.txt", "1")
	if err := c.commit(t, "node-a", first); err != nil {
		t.Fatal(err)
	}
	c.provision(t, "node-b", "warm-b")

	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "gen.txt", "2")
	c.end(t, "node-a", pv)
	pub := c.published(t)
	if len(pub.Announced) != 1 || pub.Announced[0].Node != "node-a" || pub.Announced[0].Generation != 2 || pub.Generation != 1 {
		t.Fatalf("chain after the commit %+v: want generation 1 with generation 2 announced by node-a", pub)
	}

	// node-a publishes a moment after node-b starts provisioning.
	published := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		published <- c.nodes["node-a"].sync.Publish(context.Background(), maven)
	}()
	reader := c.provision(t, "node-b", "reader")
	if err := <-published; err != nil {
		t.Fatalf("publish: %v", err)
	}
	wantFile(t, reader, "gen.txt", "2")
	if pub := c.published(t); pub.Generation != 2 || len(pub.Announced) != 0 {
		t.Errorf("chain after the publish %+v: want generation 2 and no announcement left", pub)
	}
	wantEvents(t, c.nodes["node-b"], "Warning "+kit.ReasonSyncIncomplete, 0)
	if n := histogramCount(t, c.nodes["node-b"].metrics.AnnounceWait.WithLabelValues("arrived")); n != 1 {
		t.Errorf("node-b observed %d waits that arrived, want 1", n)
	}
}

func TestAnAnnouncementThatDoesNotArriveIsAnEventNamingIt(t *testing.T) {
	c := newSyncCluster(t)
	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "late.txt", "late")
	c.end(t, "node-a", pv)

	start := time.Now()
	cold := c.provisionWith(t, "node-b", "reader", map[string]string{kit.ParamSyncTimeout: "2s"})
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("provisioning took %v with a 2s syncTimeout", took)
	}
	wantNoFile(t, cold, "late.txt")
	wantEvents(t, c.nodes["node-b"], "Warning "+kit.ReasonSyncIncomplete, 1, "generation 1 from node node-a", "syncTimeout")

	// It arrives for later builds.
	if err := c.nodes["node-a"].sync.Publish(context.Background(), maven); err != nil {
		t.Fatal(err)
	}
	wantFile(t, c.provision(t, "node-b", "later"), "late.txt", "late")
}

func TestAnnouncementsOfGoneOrDownNodesAreNotWaitedFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		gone func(t *testing.T, c *syncCluster)
	}{
		{"node deleted", func(t *testing.T, c *syncCluster) {
			if err := c.client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"node not ready", func(t *testing.T, c *syncCluster) {
			var n corev1.Node
			if err := c.client.Get(context.Background(), client.ObjectKey{Name: "node-a"}, &n); err != nil {
				t.Fatal(err)
			}
			n.Status.Conditions[0].Status = corev1.ConditionUnknown
			if err := c.client.Status().Update(context.Background(), &n); err != nil {
				t.Fatal(err)
			}
			if err := c.client.Get(context.Background(), client.ObjectKey{Name: "node-a"}, &n); err != nil || n.Status.Conditions[0].Status != corev1.ConditionUnknown {
				t.Fatalf("node-a is still %+v (%v)", n.Status.Conditions, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newSyncCluster(t)
			pv := c.provision(t, "node-a", "build")
			writeFile(t, pv, "lost.txt", "x")
			c.end(t, "node-a", pv)
			tc.gone(t, c)
			start := time.Now()
			c.provision(t, "node-b", "reader")
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("provisioning waited %v for node-a, which is %s", took, tc.name)
			}
		})
	}
}

func TestAnnouncementsOfAGoneNodeAreDroppedByTheNextAppend(t *testing.T) {
	c := newSyncCluster(t)
	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "a.txt", "a")
	c.end(t, "node-a", pv)
	if err := c.client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}); err != nil {
		t.Fatal(err)
	}
	onB := c.provision(t, "node-b", "b")
	writeFile(t, onB, "b.txt", "b")
	if err := c.commit(t, "node-b", onB); err != nil {
		t.Fatal(err)
	}
	if pub := c.published(t); len(pub.Announced) != 0 || pub.Generation != 1 {
		t.Errorf("chain %+v: want node-b's layer and node-a's announcement dropped", pub)
	}
}

// An agent killed between announce and push publishes the layer when it
// is back, and the announcement goes with the append; a layer that cannot
// be published has its announcement withdrawn with an Event.
func TestAnnouncementsAreResolved(t *testing.T) {
	t.Run("published after a restart", func(t *testing.T) {
		c := newSyncCluster(t)
		pv := c.provision(t, "node-a", "build")
		writeFile(t, pv, "a.txt", "a")
		c.end(t, "node-a", pv)
		// The agent's queue dies with it; the new agent's periodic pass
		// queues a publish of the unpublished layer.
		restarted := c.restart(t, "node-a")
		if err := restarted.sync.Publish(context.Background(), maven); err != nil {
			t.Fatal(err)
		}
		if pub := c.published(t); pub.Generation != 1 || len(pub.Announced) != 0 {
			t.Errorf("chain %+v: want the layer published and no announcement", pub)
		}
		wantFile(t, c.provision(t, "node-b", "later"), "a.txt", "a")
	})
	t.Run("kept while its volume waits for the commit after a restart", func(t *testing.T) {
		c := newSyncCluster(t)
		pv := c.provision(t, "node-a", "build")
		writeFile(t, pv, "a.txt", "a")
		// Killed after the announcement, before the commit.
		c.nodes["node-a"].prov.sync.Announce(context.Background(), maven, pv.Name)
		restarted := c.restart(t, "node-a")
		if err := restarted.sync.Publish(context.Background(), maven); err != nil {
			t.Fatal(err)
		}
		if pub := c.published(t); len(pub.Announced) != 1 {
			t.Fatalf("chain %+v: want the announcement kept for the volume still to commit", pub)
		}
		if err := c.commit(t, "node-a", pv); err != nil {
			t.Fatal(err)
		}
		if pub := c.published(t); pub.Generation != 1 || len(pub.Announced) != 0 {
			t.Errorf("chain %+v: want the layer published and no announcement", pub)
		}
	})
	t.Run("withdrawn when it cannot be published", func(t *testing.T) {
		c := newSyncCluster(t)
		a := c.nodes["node-a"]
		st := &unpublishableStore{Store: a.store, sockets: map[string]bool{}}
		a = c.startAgentWith(t, "node-a", a.store, func(p *nodeParts) { p.setStore(st) })
		pv := c.provision(t, "node-a", "build")
		writeFile(t, pv, "a.txt", "a")
		c.end(t, "node-a", pv)
		info, err := a.store.Inspect(context.Background(), maven)
		if err != nil {
			t.Fatal(err)
		}
		st.sockets[info.Layers[0].ID] = true
		if err := a.sync.Publish(context.Background(), maven); err != nil {
			t.Fatal(err)
		}
		if pub := c.published(t); len(pub.Announced) != 0 {
			t.Errorf("chain %+v: want the announcement withdrawn", pub)
		}
		wantEvents(t, a, "Warning "+kit.ReasonAnnouncementWithdrawn, 1, "node node-a withdrew", "generation 1", "cannot be published")
	})
}

// TestAnnouncingCostsOneWritePerCommit counts the Cache updates of a
// build that commits and publishes, and of a build that only reads.
func TestAnnouncingCostsOneWritePerCommit(t *testing.T) {
	c := newSyncCluster(t)
	c.provision(t, "node-b", "prepare") // records the registry: one write
	counted := &countingClient{Client: c.client}
	for _, n := range c.nodes {
		n.caches.Client = counted
	}
	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "a.txt", "a")
	if err := c.commit(t, "node-a", pv); err != nil {
		t.Fatal(err)
	}
	if got := counted.statusPatches.Load(); got != 2 {
		t.Errorf("a committed build made %d status patches of the Cache, want 2: the announcement and the append", got)
	}
	counted.statusPatches.Store(0)
	c.provision(t, "node-b", "reader")
	if got := counted.statusPatches.Load(); got != 0 {
		t.Errorf("a reading build made %d status patches of the Cache, want 0", got)
	}
	counted.statusPatches.Store(0)
	unchanged := c.provision(t, "node-a", "unchanged")
	if err := c.commit(t, "node-a", unchanged); err != nil {
		t.Fatal(err)
	}
	if got := counted.statusPatches.Load(); got != 0 {
		t.Errorf("a build that changed nothing made %d status patches of the Cache, want 0", got)
	}
}

// A commit discarded for its size made no layer: its announcement is
// taken back at once, so no reader waits for it.
func TestAnAnnouncedCommitThatMakesNoLayerIsWithdrawn(t *testing.T) {
	c := newSyncCluster(t)
	c.request = "1Mi"
	pv := c.provision(t, "node-a", "too-big")
	writeRandomFile(t, filepath.Join(pv.Spec.HostPath.Path, "big"), 2<<20)
	c.end(t, "node-a", pv)
	if pub := c.published(t); len(pub.Announced) != 0 || pub.Generation != 0 {
		t.Errorf("chain %+v: want no layer and no announcement", pub)
	}
	wantEvents(t, c.nodes["node-a"], "Warning "+kit.ReasonAnnouncementWithdrawn, 1, "made no layer")
}

// drain returns the events node recorded since the last drain.
func drain(n *syncNode) []string {
	var out []string
	for len(n.events.Events) > 0 {
		out = append(out, <-n.events.Events)
	}
	return out
}

// countingClient counts the status patches made through it.
type countingClient struct {
	client.Client
	statusPatches atomic.Int64
}

func (c *countingClient) Status() client.SubResourceWriter {
	return countingStatus{SubResourceWriter: c.Client.Status(), n: &c.statusPatches}
}

type countingStatus struct {
	client.SubResourceWriter
	n *atomic.Int64
}

func (s countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.n.Add(1)
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

func histogramCount(t testing.TB, o prometheus.Observer) uint64 {
	t.Helper()
	var out dto.Metric
	if err := o.(prometheus.Metric).Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetHistogram().GetSampleCount()
}
