package cachemanager

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

// CacheReconciler keeps the cluster-wide side of a Cache: the cleanup
// finalizer, the status fields derived from the per-node entries, and the
// removal of entries of Nodes that no longer exist.
//
// Deleting a Cache works with the node agents: each agent removes the cache
// from its node and then its own status entry; the finalizer goes once no
// entry of an existing Node remains. A Node that is gone cannot answer, so
// its entry does not hold the deletion up.
type CacheReconciler struct {
	// Client reads from the informer cache (Nodes as metadata only) and
	// writes to the API server.
	Client   client.Client
	Recorder events.EventRecorder
}

// SetupWithManager wires the controller: a Cache is reconciled when it
// changes and when a Node in its status is deleted.
func (r *CacheReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("cache").
		For(&v1alpha1.Cache{}).
		WatchesMetadata(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.cachesOnNode), builder.WithPredicates(nodeDeleted)).
		Complete(r)
}

// Reconcile adds or lifts the finalizer and writes the derived status.
func (r *CacheReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var c v1alpha1.Cache
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	gone, err := r.goneNodes(ctx, c.Status.Nodes)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !c.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.finishDeletion(ctx, &c, gone)
	}

	if !controllerutil.ContainsFinalizer(&c, v1alpha1.FinalizerCleanup) {
		patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&c, v1alpha1.FinalizerCleanup)
		if err := r.Client.Patch(ctx, &c, patch); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("adding finalizer %s: %w", v1alpha1.FinalizerCleanup, err))
		}
	}

	want := c.Status.Summarized(gone)
	if equality.Semantic.DeepEqual(want, c.Status) {
		return reconcile.Result{}, nil
	}
	// Derived fields only: a merge patch that leaves the node entries, which
	// the node agents own, alone. Dropping entries rewrites the whole list,
	// so then it must not race with an agent's write.
	var patch client.Patch = client.MergeFrom(c.DeepCopy())
	if len(gone) > 0 {
		patch = client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
	}
	c.Status = want
	if err := r.Client.Status().Patch(ctx, &c, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("writing status: %w", err))
	}
	if len(gone) > 0 {
		r.Recorder.Eventf(&c, nil, corev1.EventTypeNormal, "NodeGone", "PruneStatus",
			"Removed the status of %s: the Node no longer exists", strings.Join(slices.Sorted(maps.Keys(gone)), ", "))
	}
	return reconcile.Result{}, nil
}

// finishDeletion lifts the finalizer once no existing Node holds the cache.
// Until then the agents' status updates bring the Cache back here.
func (r *CacheReconciler) finishDeletion(ctx context.Context, c *v1alpha1.Cache, gone map[string]bool) error {
	if !controllerutil.ContainsFinalizer(c, v1alpha1.FinalizerCleanup) {
		return nil
	}
	var waiting []string
	for _, n := range c.Status.Nodes {
		if !gone[n.Node] {
			waiting = append(waiting, n.Node)
		}
	}
	if len(waiting) > 0 {
		log.FromContext(ctx).Info("waiting for node agents to clear the cache", "nodes", waiting)
		r.Recorder.Eventf(c, nil, corev1.EventTypeNormal, "Clearing", "Delete",
			"Waiting for the node agents of %s to remove the cache; if a node's agent cannot run any more, delete the Node or remove finalizer %s",
			strings.Join(waiting, ", "), v1alpha1.FinalizerCleanup)
		return nil
	}
	patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(c, v1alpha1.FinalizerCleanup)
	if err := r.Client.Patch(ctx, c, patch); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("removing finalizer %s: %w", v1alpha1.FinalizerCleanup, err))
	}
	log.FromContext(ctx).Info("cache cleared on every node")
	return nil
}

// goneNodes returns the nodes of the entries whose Node does not exist.
func (r *CacheReconciler) goneNodes(ctx context.Context, entries []v1alpha1.NodeCacheStatus) (map[string]bool, error) {
	gone := map[string]bool{}
	for _, e := range entries {
		node := &metav1.PartialObjectMetadata{}
		node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
		if err := r.Client.Get(ctx, types.NamespacedName{Name: e.Node}, node); err != nil {
			if !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("looking up Node %s: %w", e.Node, err)
			}
			gone[e.Node] = true
		}
	}
	return gone, nil
}

func (r *CacheReconciler) cachesOnNode(ctx context.Context, obj client.Object) []reconcile.Request {
	var caches v1alpha1.CacheList
	if err := r.Client.List(ctx, &caches, client.MatchingFields{indexCacheNodes: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing the caches of a deleted Node", "node", obj.GetName())
		return nil
	}
	return cacheRequests(caches)
}

// cacheRequests asks for a reconcile of each of caches.
func cacheRequests(caches v1alpha1.CacheList) []reconcile.Request {
	reqs := make([]reconcile.Request, 0, len(caches.Items))
	for _, c := range caches.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&c)})
	}
	return reqs
}

var nodeDeleted = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}
