package cachemanager

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

const gib = 1 << 30

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// replica is node's CacheReplica of ci/maven.
func replica(node string, gen, size int64, lastUsed int) *v1alpha1.CacheReplica {
	return replicaOf("maven", node, v1alpha1.CacheReplicaStatus{Generation: gen, Layers: int32(gen), SizeBytes: size, LastUsed: at(lastUsed), LastWriter: ns + "/ws"})
}

// replicaOf is node's CacheReplica of cache with status st.
func replicaOf(cache, node string, st v1alpha1.CacheReplicaStatus) *v1alpha1.CacheReplica {
	return &v1alpha1.CacheReplica{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.CacheReplicaName(cache, node), Namespace: ns},
		Spec:       v1alpha1.CacheReplicaSpec{Cache: cache, Node: node},
		Status:     st,
	}
}

func cacheObj(finalizers []string, deleting bool) *v1alpha1.Cache {
	c := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Name: "maven", Namespace: ns, Finalizers: finalizers}}
	if deleting {
		c.DeletionTimestamp = at(900)
	}
	return c
}

// withStatus gives c derived fields as a former reconcile wrote them.
func withStatus(c *v1alpha1.Cache, derived v1alpha1.CacheStatus) *v1alpha1.Cache {
	c.Status = derived
	return c
}

// seeded is r as a node reports a copy created on main at generation gen.
func seeded(r *v1alpha1.CacheReplica, gen int64) *v1alpha1.CacheReplica {
	r.Status.SeededFrom = &v1alpha1.CacheSeed{Namespace: ns, Name: "main", Generation: gen}
	return r
}

// replicaNodes lists the nodes of the replicas c holds, sorted.
func replicaNodes(t *testing.T, c client.Client) []string {
	t.Helper()
	var list v1alpha1.CacheReplicaList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, r := range list.Items {
		nodes = append(nodes, r.Spec.Node)
	}
	slices.Sort(nodes)
	return nodes
}

func TestCacheReconcile(t *testing.T) {
	cleanup := []string{v1alpha1.FinalizerCleanup}
	tests := []struct {
		name  string
		nodes []string
		// joined are Nodes the API server has and the informer cache
		// has not seen yet.
		joined   []string
		cache    *v1alpha1.Cache
		replicas []*v1alpha1.CacheReplica
		gone     bool // the Cache no longer exists afterwards
		status   v1alpha1.CacheStatus
		left     []string // the nodes whose replicas remain
		events   []string
	}{{
		name:  "new cache gets the finalizer",
		cache: cacheObj(nil, false),
	}, {
		name:     "status is derived from the replicas",
		nodes:    []string{"node-a", "node-b"},
		cache:    cacheObj(cleanup, false),
		replicas: []*v1alpha1.CacheReplica{replica("node-a", 3, gib, 10), replica("node-b", 5, gib/2, 20)},
		status:   v1alpha1.CacheStatus{Generation: 5, Size: "1.5GiB", NodeCount: 2, LastUsed: at(20)},
		left:     []string{"node-a", "node-b"},
	}, {
		name:     "replicas of nodes that no longer exist are deleted",
		nodes:    []string{"node-a"},
		cache:    cacheObj(cleanup, false),
		replicas: []*v1alpha1.CacheReplica{replica("node-a", 2, 4096, 10), replica("node-old", 9, gib, 30)},
		status:   v1alpha1.CacheStatus{Generation: 2, Size: "4.0KiB", NodeCount: 1, LastUsed: at(10)},
		left:     []string{"node-a"},
		events:   []string{"Normal NodeGone Deleted the CacheReplicas of node-old: the Node no longer exists"},
	}, {
		name:     "the replica of a Node that just joined is kept",
		nodes:    []string{"node-a"},
		joined:   []string{"node-new"},
		cache:    cacheObj(cleanup, false),
		replicas: []*v1alpha1.CacheReplica{replica("node-a", 2, 4096, 10), replica("node-new", 3, 4096, 20)},
		status:   v1alpha1.CacheStatus{Generation: 3, Size: "8.0KiB", NodeCount: 2, LastUsed: at(20)},
		left:     []string{"node-a", "node-new"},
	}, {
		name:   "last used stays when every node evicted the cache",
		cache:  withStatus(cacheObj(cleanup, false), v1alpha1.CacheStatus{Generation: 4, Size: "1.0GiB", NodeCount: 1, LastUsed: at(40)}),
		status: v1alpha1.CacheStatus{LastUsed: at(40)},
	}, {
		name:     "last used stays when the newest node evicted the cache",
		nodes:    []string{"node-a"},
		cache:    withStatus(cacheObj(cleanup, false), v1alpha1.CacheStatus{LastUsed: at(40)}),
		replicas: []*v1alpha1.CacheReplica{replica("node-a", 2, 100, 10)},
		status:   v1alpha1.CacheStatus{Generation: 2, Size: "100B", NodeCount: 1, LastUsed: at(40)},
		left:     []string{"node-a"},
	}, {
		name:  "seeded from names each fallback generation of the nodes once",
		nodes: []string{"node-a", "node-b", "node-c"},
		cache: cacheObj(cleanup, false),
		replicas: []*v1alpha1.CacheReplica{seeded(replica("node-a", 1, 100, 10), 3), seeded(replica("node-b", 2, 100, 10), 3),
			seeded(replica("node-c", 1, 100, 10), 2)},
		status: v1alpha1.CacheStatus{Generation: 2, Size: "300B", NodeCount: 3, LastUsed: at(10), SeededFrom: ns + "/main@2, " + ns + "/main@3"},
		left:   []string{"node-a", "node-b", "node-c"},
	}, {
		name:     "seeded from goes with the seeded replicas",
		nodes:    []string{"node-a"},
		cache:    withStatus(cacheObj(cleanup, false), v1alpha1.CacheStatus{SeededFrom: ns + "/main@3"}),
		replicas: []*v1alpha1.CacheReplica{replica("node-a", 1, 100, 10)},
		status:   v1alpha1.CacheStatus{Generation: 1, Size: "100B", NodeCount: 1, LastUsed: at(10)},
		left:     []string{"node-a"},
	}, {
		name:     "a replica of another cache does not count",
		nodes:    []string{"node-a"},
		cache:    cacheObj(cleanup, false),
		replicas: []*v1alpha1.CacheReplica{replica("node-a", 1, 100, 10), replicaOf("npm", "node-a", v1alpha1.CacheReplicaStatus{Generation: 7})},
		status:   v1alpha1.CacheStatus{Generation: 1, Size: "100B", NodeCount: 1, LastUsed: at(10)},
		left:     []string{"node-a", "node-a"},
	}, {
		name:     "deleted cache waits for the agents of existing nodes",
		nodes:    []string{"node-a", "node-b"},
		cache:    cacheObj(cleanup, true),
		replicas: []*v1alpha1.CacheReplica{replica("node-a", 2, 100, 10), replica("node-gone", 1, 100, 10)},
		left:     []string{"node-a", "node-gone"},
		events:   []string{"Normal Clearing Waiting for the node agents of node-a to remove the cache"},
	}, {
		name:     "deleted cache held only by gone nodes is released",
		nodes:    []string{"node-a"},
		cache:    cacheObj(cleanup, true),
		replicas: []*v1alpha1.CacheReplica{replica("node-gone", 1, 100, 10)},
		gone:     true,
	}, {
		name:  "deleted cache without replicas is released",
		cache: cacheObj(cleanup, true),
		gone:  true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			objs := []client.Object{tc.cache.DeepCopy()}
			for _, n := range tc.nodes {
				objs = append(objs, node(n))
			}
			for _, r := range tc.replicas {
				objs = append(objs, r)
			}
			c := newFakeClient(t, objs...)
			var api []client.Object
			for _, n := range append(tc.nodes, tc.joined...) {
				api = append(api, node(n))
			}
			rec := events.NewFakeRecorder(100)
			r := &CacheReconciler{Client: c, APIReader: newFakeClient(t, api...), Recorder: rec}
			key := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tc.cache)}
			for range 2 {
				if _, err := r.Reconcile(ctx, key); err != nil {
					t.Fatalf("Reconcile() error = %v", err)
				}
			}

			var got v1alpha1.Cache
			err := c.Get(ctx, key.NamespacedName, &got)
			if tc.gone {
				if !apierrors.IsNotFound(err) {
					t.Fatalf("cache: err = %v, finalizers %v, want it gone", err, got.Finalizers)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Finalizers) != 1 || got.Finalizers[0] != v1alpha1.FinalizerCleanup {
				t.Errorf("finalizers = %v, want [%s]", got.Finalizers, v1alpha1.FinalizerCleanup)
			}
			if !equality.Semantic.DeepEqual(got.Status, tc.status) {
				t.Errorf("status = %+v\nwant     %+v", got.Status, tc.status)
			}
			if left := replicaNodes(t, c); !slices.Equal(left, tc.left) {
				t.Errorf("replicas left on %v, want %v", left, tc.left)
			}
			gotEvents := drain(rec)
			if len(gotEvents) < len(tc.events) || (len(tc.events) == 0 && len(gotEvents) > 0) {
				t.Fatalf("events = %q, want %q", gotEvents, tc.events)
			}
			for i, want := range tc.events {
				if !strings.HasPrefix(gotEvents[i], want) {
					t.Errorf("event %d = %q, want it to start with %q", i, gotEvents[i], want)
				}
			}
		})
	}
}

// TestCacheDeletionFlow follows a Cache through its life with two node
// agents, played here by replica writes.
func TestCacheDeletionFlow(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, node("node-a"), node("node-b"), cacheObj(nil, false))
	r := &CacheReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100)}
	key := types.NamespacedName{Namespace: ns, Name: "maven"}
	reconcileOK := func() {
		t.Helper()
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
			t.Fatalf("Reconcile() error = %v", err)
		}
	}
	remove := func(node string) {
		t.Helper()
		if err := c.Delete(ctx, replica(node, 0, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	get := func() (*v1alpha1.Cache, error) {
		var cur v1alpha1.Cache
		err := c.Get(ctx, key, &cur)
		return &cur, err
	}

	reconcileOK()
	for _, r := range []*v1alpha1.CacheReplica{replica("node-a", 1, 2048, 10), replica("node-b", 1, 1024, 15)} {
		if err := c.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	reconcileOK()
	cur, err := get()
	if err != nil {
		t.Fatal(err)
	}
	if cur.Status.Generation != 1 || cur.Status.Size != "3.0KiB" || cur.Status.NodeCount != 2 {
		t.Fatalf("status = %+v, want generation 1, size 3.0KiB, 2 nodes", cur.Status)
	}

	if err := c.Delete(ctx, cur); err != nil {
		t.Fatal(err)
	}
	reconcileOK()
	if _, err := get(); err != nil {
		t.Fatalf("cache gone while both agents still hold it: %v", err)
	}

	remove("node-a") // node-a's agent cleared it
	reconcileOK()
	if _, err := get(); err != nil {
		t.Fatalf("cache gone while node-b's agent still holds it: %v", err)
	}

	remove("node-b") // node-b's agent cleared it
	reconcileOK()
	if _, err := get(); !apierrors.IsNotFound(err) {
		t.Fatalf("cache: err = %v, want it gone once no agent holds it", err)
	}
}

func TestCachesOnNode(t *testing.T) {
	c := newFakeClient(t, replica("node-a", 1, 1, 1), replicaOf("npm", "node-b", v1alpha1.CacheReplicaStatus{}))
	r := &CacheReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(1)}
	got := r.cachesOnNode(context.Background(), node("node-b"))
	if len(got) != 1 || got[0].Name != "npm" {
		t.Errorf("cachesOnNode(node-b) = %v, want [%s/npm]", got, ns)
	}
}

// Regression: the derived status left out status.published, so the
// manager's status patch deleted the registry chain that node agents
// sequence there, whenever a node's state changed.
func TestCacheReconcileKeepsThePublishedChain(t *testing.T) {
	ctx := context.Background()
	chain := &v1alpha1.PublishedChain{Repository: "registry.example:5000/ci-caches/builds/maven", Generation: 1, Layers: []v1alpha1.PublishedLayer{{
		Generation: 1, Digest: "sha256:aa", DiffID: "sha256:bb", MediaType: "application/vnd.oci.image.layer.v1.tar+zstd", Size: 10,
	}}}
	cache := cacheObj([]string{v1alpha1.FinalizerCleanup}, false)
	cache.Status.Published = chain.DeepCopy()
	c := newFakeClient(t, node("node-a"), cache, replica("node-a", 1, 4096, 10))
	r := &CacheReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(10)}
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(cache)}); err != nil {
		t.Fatalf("Reconcile() error = %v", err)
	}
	var got v1alpha1.Cache
	if err := c.Get(ctx, client.ObjectKeyFromObject(cache), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Generation != 1 || got.Status.NodeCount != 1 {
		t.Errorf("derived status = %+v, want generation 1 on 1 node", got.Status)
	}
	if !equality.Semantic.DeepEqual(got.Status.Published, chain) {
		t.Errorf("published = %+v, want %+v", got.Status.Published, chain)
	}
}
