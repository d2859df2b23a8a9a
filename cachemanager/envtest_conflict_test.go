//go:build envtest

package cachemanager

import (
	"context"
	"reflect"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

// staleClient answers Get of one object with an old copy of it, as a
// lagging informer cache does; everything else goes to the API server.
type staleClient struct {
	client.Client
	stale client.Object
}

func (s staleClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if key != client.ObjectKeyFromObject(s.stale) || reflect.TypeOf(obj) != reflect.TypeOf(s.stale) {
		return s.Client.Get(ctx, key, obj, opts...)
	}
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(s.stale.DeepCopyObject()).Elem())
	return nil
}

// The manager's writes that replace a whole list (a claim's finalizers, a
// Cache's node entries) carry the resourceVersion they were computed from.
// From a stale read the API server refuses them with a conflict, and what
// another writer added in between survives; the retry, from a fresh read,
// converges.
func TestEnvtestStaleWritesConflict(t *testing.T) {
	t.Run("outcome finalizer added from a stale claim", func(t *testing.T) {
		a := newAPITest(t)
		pvc := a.createClaim("ws")
		if err := a.get(a.ctx, pvc); err != nil {
			t.Fatal(err)
		}
		stale := pvc.DeepCopy()
		// Another controller adds its own finalizer meanwhile.
		patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
		pvc.Finalizers = append(pvc.Finalizers, "example.com/other")
		if err := a.c.Patch(a.ctx, pvc, patch); err != nil {
			t.Fatal(err)
		}

		r := &ReleaseReconciler{Client: staleClient{a.c, stale}, APIReader: a.c, Recorder: events.NewFakeRecorder(10), Metrics: testMetrics(t)}
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pvc)}
		if _, err := r.Reconcile(a.ctx, req); !apierrors.IsConflict(err) {
			t.Fatalf("Reconcile() from a stale claim: %v, want a conflict", err)
		}
		if err := a.hasFinalizers(pvc, finalizerPVCProtection, "example.com/other")(a.ctx); err != nil {
			t.Fatalf("after the refused write: %v", err)
		}
		// The manager, from its informer cache, converges.
		a.startManager()
		a.eventually("the outcome finalizer beside the other", a.hasFinalizers(pvc, finalizerPVCProtection, "example.com/other", v1alpha1.FinalizerOutcome))
	})

	t.Run("gone node pruned from a stale Cache", func(t *testing.T) {
		a := newAPITest(t)
		nodeA, nodeB := a.createNode(a.ns+"-a").Name, a.createNode(a.ns+"-b").Name
		gone := a.ns + "-gone"
		c := a.createCache("maven", nodeA)
		now := time.Now().Truncate(time.Second)
		a.applyEntry(c, nodeA, nodeEntry(nodeA, 1, 1024, now))
		a.applyEntry(c, gone, nodeEntry(gone, 1, 1024, now))
		stale := c.DeepCopy()
		if err := a.get(a.ctx, stale); err != nil {
			t.Fatal(err)
		}
		stale.Finalizers = []string{v1alpha1.FinalizerCleanup} // past the finalizer step, to the status write
		// Node b's agent commits meanwhile.
		a.applyEntry(c, nodeB, nodeEntry(nodeB, 2, 2048, now))

		r := &CacheReconciler{Client: staleClient{a.c, stale}, Recorder: events.NewFakeRecorder(10)}
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(c)}
		if _, err := r.Reconcile(a.ctx, req); !apierrors.IsConflict(err) {
			t.Fatalf("Reconcile() from a stale Cache: %v, want a conflict", err)
		}
		var cur v1alpha1.Cache
		if err := a.c.Get(a.ctx, req.NamespacedName, &cur); err != nil {
			t.Fatal(err)
		}
		if n := len(cur.Status.Nodes); n != 3 {
			t.Fatalf("after the refused write the Cache has %d node entries, want 3 (a, gone, b): %+v", n, cur.Status.Nodes)
		}
		// The manager, from its informer cache, converges.
		a.startManager()
		a.eventually("the gone node pruned, node b's entry kept", a.statusIs(c, derived{[]string{nodeA, nodeB}, 2, "3.0KiB", now, ""}))
	})
}
