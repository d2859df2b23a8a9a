//go:build envtest

package cachemanager

import (
	"context"
	"reflect"
	"testing"

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

// The manager's writes that replace a whole list (a claim's finalizers)
// carry the resourceVersion they were computed from.
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

}
