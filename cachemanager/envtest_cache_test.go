//go:build envtest

package cachemanager

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// agentFieldManager is the field manager of a node agent, which applies
// that node's CacheReplicas (nodeagent/kit/caches.go).
func agentFieldManager(node string) string { return "layercache-node-" + node }

// createNode creates a Node object; the test deletes it at the end.
func (a *apiTest) createNode(name string) *corev1.Node {
	a.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := a.c.Create(a.ctx, n); err != nil {
		a.t.Fatalf("creating Node %s: %v", name, err)
	}
	a.clusterScoped = append(a.clusterScoped, n)
	return n
}

// createCache creates a Cache as a node agent does on a cache's first use.
func (a *apiTest) createCache(name, node string) *v1alpha1.Cache {
	a.t.Helper()
	c := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: name}}
	if err := a.c.Create(a.ctx, c, client.FieldOwner(agentFieldManager(node))); err != nil {
		a.t.Fatalf("creating Cache %s: %v", name, err)
	}
	return c
}

// applyEntry states node's replica of the Cache the way its node agent
// does: server-side apply under the agent's own field manager, forcing
// ownership. A nil status deletes the replica, as the agent does when the
// cache leaves its node.
func (a *apiTest) applyEntry(c *v1alpha1.Cache, node string, st *v1alpha1.CacheReplicaStatus) {
	a.t.Helper()
	if st == nil {
		r := &v1alpha1.CacheReplica{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: v1alpha1.CacheReplicaName(c.Name, node)}}
		if err := a.c.Delete(a.ctx, r); err != nil {
			a.t.Fatalf("deleting node %s's replica of Cache %s: %v", node, c.Name, err)
		}
		return
	}
	b := v1alpha1.CacheReplicaApply(c.Namespace, c.Name, c.UID, node, *st)
	if err := a.c.Apply(a.ctx, b, client.FieldOwner(agentFieldManager(node)), client.ForceOwnership); err != nil {
		a.t.Fatalf("applying node %s's replica of Cache %s: %v", node, c.Name, err)
	}
}

// nodeEntry is a node's replica status; lastUsed is in whole seconds, as
// the agent writes it.
func nodeEntry(gen, size int64, lastUsed time.Time) *v1alpha1.CacheReplicaStatus {
	t := metav1.NewTime(lastUsed.Truncate(time.Second))
	return &v1alpha1.CacheReplicaStatus{Generation: gen, Layers: int32(gen), SizeBytes: size, LastUsed: &t, LastWriter: "builds/build-1"}
}

// seededEntry is st of a copy that its node created on fallback name at
// generation gen.
func seededEntry(st *v1alpha1.CacheReplicaStatus, namespace, name string, gen int64) *v1alpha1.CacheReplicaStatus {
	st.SeededFrom = &v1alpha1.CacheSeed{Namespace: namespace, Name: name, Generation: gen}
	return st
}

// derived is what the manager derives from the replicas.
type derived struct {
	nodes      []string // the replicas' nodes, sorted
	generation int64
	size       string
	lastUsed   time.Time // zero for none
	seededFrom string
}

// statusIs reports nil once the Cache has the replicas and derived fields
// of want.
func (a *apiTest) statusIs(c *v1alpha1.Cache, want derived) func(context.Context) error {
	return func(ctx context.Context) error {
		var cur v1alpha1.Cache
		if err := a.c.Get(ctx, client.ObjectKeyFromObject(c), &cur); err != nil {
			return err
		}
		st := cur.Status
		var replicas v1alpha1.CacheReplicaList
		if err := a.c.List(ctx, &replicas, client.InNamespace(c.Namespace), client.MatchingLabels{v1alpha1.LabelReplicaCache: c.Name}); err != nil {
			return err
		}
		var nodes []string
		for _, r := range replicas.Items {
			nodes = append(nodes, r.Spec.Node)
		}
		slices.Sort(nodes)
		var lastUsed time.Time
		if st.LastUsed != nil {
			lastUsed = st.LastUsed.Time
		}
		if !slices.Equal(nodes, want.nodes) || st.Generation != want.generation || st.Size != want.size ||
			int(st.NodeCount) != len(want.nodes) || !lastUsed.Equal(want.lastUsed) || st.SeededFrom != want.seededFrom {
			return fmt.Errorf("status: nodes %v, generation %d, size %q, nodeCount %d, lastUsed %v, seededFrom %q; want nodes %v, generation %d, size %q, lastUsed %v, seededFrom %q",
				nodes, st.Generation, st.Size, st.NodeCount, lastUsed, st.SeededFrom, want.nodes, want.generation, want.size, want.lastUsed, want.seededFrom)
		}
		return nil
	}
}

// TestEnvtestCacheStatusFollowsReplicas: node agents apply their own
// replicas with server-side apply; the manager's derived fields follow.
func TestEnvtestCacheStatusFollowsReplicas(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	nodeA, nodeB := a.createNode(a.ns+"-a").Name, a.createNode(a.ns+"-b").Name
	c := a.createCache("maven", nodeA)
	a.eventually("the cleanup finalizer", a.hasFinalizers(c, v1alpha1.FinalizerCleanup))

	t1 := time.Now().Add(-time.Hour).Truncate(time.Second)
	t2 := t1.Add(10 * time.Minute)
	steps := []struct {
		name  string
		node  string
		entry *v1alpha1.CacheReplicaStatus
		want  derived
	}{
		{"node a commits", nodeA, nodeEntry(3, gib, t1), derived{[]string{nodeA}, 3, "1.0GiB", t1, ""}},
		{"node b commits", nodeB, nodeEntry(5, gib/2, t2), derived{[]string{nodeA, nodeB}, 5, "1.5GiB", t2, ""}},
		{"node a commits again, seeded", nodeA, seededEntry(nodeEntry(6, gib, t1), a.ns, "main", 2),
			derived{[]string{nodeA, nodeB}, 6, "1.5GiB", t2, a.ns + "/main@2"}},
		// The newest last use stays when its node evicts the cache, and
		// when every node has.
		{"node b removes the cache", nodeB, nil, derived{[]string{nodeA}, 6, "1.0GiB", t2, a.ns + "/main@2"}},
		{"node a removes the cache", nodeA, nil, derived{lastUsed: t2}},
	}
	for _, s := range steps {
		a.applyEntry(c, s.node, s.entry)
		a.eventually(s.name+": the derived status", a.statusIs(c, s.want))
	}
	if err := a.hasFinalizers(c, v1alpha1.FinalizerCleanup)(a.ctx); err != nil {
		t.Error(err)
	}
}

// TestEnvtestCacheDeletion: a deleted Cache is held by the cleanup finalizer
// until no existing Node has a replica of it, then released. Replicas of
// Nodes that do not exist are deleted, with a NodeGone Event.
func TestEnvtestCacheDeletion(t *testing.T) {
	tests := []struct {
		name    string
		entries []string // nodes with a replica; each exists as a Node
		// finish lets the held Cache go: an agent deletes its replica, or
		// a Node is deleted.
		finish func(a *apiTest, c *v1alpha1.Cache, nodes map[string]*corev1.Node)
	}{{
		name:    "released once the last agent deletes its replica",
		entries: []string{"a", "b"},
		finish: func(a *apiTest, c *v1alpha1.Cache, nodes map[string]*corev1.Node) {
			a.applyEntry(c, nodes["a"].Name, nil)
			a.stays("the Cache is held while node b's replica remains", a.hasFinalizers(c, v1alpha1.FinalizerCleanup))
			a.applyEntry(c, nodes["b"].Name, nil)
		},
	}, {
		name:    "released once the Node of the last replica is deleted",
		entries: []string{"a"},
		finish: func(a *apiTest, c *v1alpha1.Cache, nodes map[string]*corev1.Node) {
			if err := a.c.Delete(a.ctx, nodes["a"]); err != nil {
				a.t.Fatalf("deleting Node %s: %v", nodes["a"].Name, err)
			}
		},
	}, {
		name:   "released at once without replicas",
		finish: func(*apiTest, *v1alpha1.Cache, map[string]*corev1.Node) {},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPITest(t)
			a.startManager()
			nodes := map[string]*corev1.Node{}
			var names []string
			for _, e := range tc.entries {
				nodes[e] = a.createNode(a.ns + "-" + e)
				names = append(names, nodes[e].Name)
			}
			c := a.createCache("maven", a.ns+"-a")
			a.eventually("the cleanup finalizer", a.hasFinalizers(c, v1alpha1.FinalizerCleanup))
			now := time.Now().Truncate(time.Second)
			for _, n := range names {
				a.applyEntry(c, n, nodeEntry(1, 4096, now))
			}
			// An agent whose Node was deleted left a replica behind.
			gone := a.ns + "-gone"
			a.applyEntry(c, gone, nodeEntry(9, gib, now))
			want := derived{nodes: names}
			if len(names) > 0 {
				want = derived{names, 1, v1alpha1.FormatSize(int64(4096 * len(names))), now, ""}
			}
			a.eventually("the gone Node's replica deleted", a.statusIs(c, want))
			a.waitEvent("Cache", c.Name, "Normal NodeGone Deleted the CacheReplicas of "+gone+": the Node no longer exists")

			if err := a.c.Delete(a.ctx, c); err != nil {
				t.Fatalf("deleting the Cache: %v", err)
			}
			if len(names) > 0 {
				a.waitEvent("Cache", c.Name, "Normal Clearing Waiting for the node agents of "+names[0])
				a.stays("the deleted Cache is held for its nodes' agents", a.hasFinalizers(c, v1alpha1.FinalizerCleanup))
			}
			tc.finish(a, c, nodes)
			a.eventually("the Cache gone", a.gone(c))
		})
	}
}

// publish appends a layer to the Cache's published chain the way a node
// agent does (nodeagent/kit/caches.go, UpdatePublished): a merge patch of the
// status with the read resourceVersion as precondition, retried on a
// conflict.
func (a *apiTest) publish(c *v1alpha1.Cache, node string, layer v1alpha1.PublishedLayer) {
	a.t.Helper()
	a.eventually("node "+node+" publishing generation "+fmt.Sprint(layer.Generation), func(ctx context.Context) error {
		var cur v1alpha1.Cache
		if err := a.c.Get(ctx, client.ObjectKeyFromObject(c), &cur); err != nil {
			return err
		}
		orig := cur.DeepCopy()
		chain := cur.Status.Published
		if chain == nil {
			chain = &v1alpha1.PublishedChain{Repository: "registry.example:5000/ci-caches/" + c.Namespace + "/" + c.Name}
		}
		chain.Generation = layer.Generation
		chain.Layers = append([]v1alpha1.PublishedLayer{layer}, chain.Layers...)
		cur.Status.Published = chain
		return a.c.Status().Patch(ctx, &cur, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}),
			client.FieldOwner(agentFieldManager(node)))
	})
}

// publishedIs reports nil once the Cache's published chain has the digests
// of want, newest first.
func (a *apiTest) publishedIs(c *v1alpha1.Cache, want ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		var cur v1alpha1.Cache
		if err := a.c.Get(ctx, client.ObjectKeyFromObject(c), &cur); err != nil {
			return err
		}
		var got []string
		if p := cur.Status.Published; p != nil {
			for _, l := range p.Layers {
				got = append(got, l.Digest)
			}
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("published chain %v, want %v", got, want)
		}
		return nil
	}
}

// TestEnvtestCacheStatusKeepsThePublishedChain: with a registry, node
// agents sequence the cluster-wide chain in status.published. The
// manager's derived status must leave it alone: the chain is how the other
// nodes find the layers.
func TestEnvtestCacheStatusKeepsThePublishedChain(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	node := a.createNode(a.ns + "-a").Name
	c := a.createCache("maven", node)
	a.eventually("the cleanup finalizer", a.hasFinalizers(c, v1alpha1.FinalizerCleanup))

	layer := func(gen int64) v1alpha1.PublishedLayer {
		return v1alpha1.PublishedLayer{
			Generation: gen, Node: node, Size: 1024, MediaType: "application/vnd.oci.image.layer.v1.tar+zstd",
			Digest: fmt.Sprintf("sha256:%064d", gen), DiffID: fmt.Sprintf("sha256:%064d", gen+100),
		}
	}
	now := time.Now().Truncate(time.Second)
	// Commit, push, and report, as the agent does after each build.
	for gen := int64(1); gen <= 2; gen++ {
		a.applyEntry(c, node, nodeEntry(gen, gen*1024, now))
		a.publish(c, node, layer(gen))
		a.eventually(fmt.Sprintf("generation %d derived", gen), a.statusIs(c, derived{[]string{node}, gen, v1alpha1.FormatSize(gen * 1024), now, ""}))
	}
	want := []string{layer(2).Digest, layer(1).Digest}
	a.eventually("the published chain", a.publishedIs(c, want...))
	a.stays("the published chain is kept", a.publishedIs(c, want...))
}
