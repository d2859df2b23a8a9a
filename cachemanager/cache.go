package cachemanager

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

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
// finalizer, the status fields derived from its CacheReplicas, and the
// deletion of replicas of Nodes that no longer exist.
//
// Deleting a Cache works with the node agents: each agent removes the cache
// from its node and then deletes its replica; the finalizer goes once no
// replica of an existing Node remains. A Node that is gone cannot answer,
// so its replica does not hold the deletion up (the garbage collector
// deletes it with the Cache, its owner).
type CacheReconciler struct {
	// Client reads from the informer cache (Nodes as metadata only) and
	// writes to the API server.
	Client client.Client
	// APIReader confirms, past the informer cache, that a Node is gone
	// before its replicas are deleted: a Node that just joined may not be
	// in the cache yet, and its agent may have reported already.
	APIReader client.Reader
	Recorder  events.EventRecorder

	// written is when each Cache's summary was last written, so that a
	// burst of commits to one cache costs one summary write per
	// summaryInterval, not one per commit.
	written sync.Map // types.NamespacedName -> time.Time
}

// summaryInterval is the shortest time between two summary writes of one
// Cache. The first change after a quiet spell is written at once; the
// summary is informational (kubectl, retention reads the replicas too),
// so a few seconds' lag costs nothing.
const summaryInterval = 5 * time.Second

// SetupWithManager wires the controller: a Cache is reconciled when it
// or one of its replicas changes, and when a Node that holds it is
// deleted.
func (r *CacheReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("cache").
		For(&v1alpha1.Cache{}).
		Watches(&v1alpha1.CacheReplica{}, handler.EnqueueRequestsFromMapFunc(replicaCache)).
		WatchesMetadata(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.cachesOnNode), builder.WithPredicates(nodeDeleted)).
		Complete(r)
}

// Reconcile adds or lifts the finalizer and writes the derived status.
func (r *CacheReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var c v1alpha1.Cache
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		if apierrors.IsNotFound(err) {
			r.written.Delete(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if c.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(&c, v1alpha1.FinalizerCleanup) {
		// A summary was written moments ago: what changed since is summed
		// up then, in one pass over the replicas, not one per change (a
		// cache used by thousands of nodes changes many times a second).
		if wait := r.untilWrite(req.NamespacedName); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
	}
	replicas, err := replicasOf(ctx, r.Client, &c)
	if err != nil {
		return reconcile.Result{}, err
	}
	held, gone, err := r.splitGone(ctx, replicas)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !c.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.finishDeletion(ctx, &c, held)
	}
	if err := r.deleteReplicas(ctx, &c, gone); err != nil {
		return reconcile.Result{}, err
	}

	if !controllerutil.ContainsFinalizer(&c, v1alpha1.FinalizerCleanup) {
		patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&c, v1alpha1.FinalizerCleanup)
		if err := r.Client.Patch(ctx, &c, patch); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("adding finalizer %s: %w", v1alpha1.FinalizerCleanup, err))
		}
	}

	want := c.Status.Summarized(held)
	if equality.Semantic.DeepEqual(want, c.Status) {
		return reconcile.Result{}, nil
	}
	// Derived fields only: a merge patch of what changed, which leaves the
	// published chain, the node agents', alone.
	patch := client.MergeFrom(c.DeepCopy())
	c.Status = want
	if err := r.Client.Status().Patch(ctx, &c, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("writing status: %w", err))
	}
	r.written.Store(req.NamespacedName, time.Now())
	return reconcile.Result{}, nil
}

// untilWrite is how long the summary of Cache key must wait before it
// may be written again; 0 for now.
func (r *CacheReconciler) untilWrite(key types.NamespacedName) time.Duration {
	last, ok := r.written.Load(key)
	if !ok {
		return 0
	}
	return max(0, summaryInterval-time.Since(last.(time.Time)))
}

// deleteReplicas deletes the replicas of Nodes that no longer exist.
func (r *CacheReconciler) deleteReplicas(ctx context.Context, c *v1alpha1.Cache, gone []v1alpha1.CacheReplica) error {
	var nodes []string
	for i := range gone {
		uid := gone[i].UID
		if err := r.Client.Delete(ctx, &gone[i], client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting CacheReplica %s of a gone Node: %w", gone[i].Name, err)
		}
		nodes = append(nodes, gone[i].Spec.Node)
	}
	if len(nodes) > 0 {
		slices.Sort(nodes)
		r.Recorder.Eventf(c, nil, corev1.EventTypeNormal, "NodeGone", "PruneStatus",
			"Deleted the CacheReplicas of %s: the Node no longer exists", strings.Join(nodes, ", "))
	}
	return nil
}

// finishDeletion lifts the finalizer once no existing Node holds the cache.
// Until then the agents' replica deletions bring the Cache back here.
func (r *CacheReconciler) finishDeletion(ctx context.Context, c *v1alpha1.Cache, held []v1alpha1.CacheReplica) error {
	if !controllerutil.ContainsFinalizer(c, v1alpha1.FinalizerCleanup) {
		return nil
	}
	if len(held) > 0 {
		waiting := make([]string, 0, len(held))
		for _, h := range held {
			waiting = append(waiting, h.Spec.Node)
		}
		slices.Sort(waiting)
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

// splitGone splits replicas into those of existing Nodes and those of
// Nodes that no longer exist.
func (r *CacheReconciler) splitGone(ctx context.Context, replicas []v1alpha1.CacheReplica) (held, gone []v1alpha1.CacheReplica, err error) {
	for _, rep := range replicas {
		node := &metav1.PartialObjectMetadata{}
		node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
		err := r.Client.Get(ctx, types.NamespacedName{Name: rep.Spec.Node}, node)
		switch {
		case apierrors.IsNotFound(err) && !nodeExists(ctx, r.APIReader, rep.Spec.Node):
			gone = append(gone, rep)
		case apierrors.IsNotFound(err): // the cache has yet to see it
			held = append(held, rep)
		case err != nil:
			return nil, nil, fmt.Errorf("looking up Node %s: %w", rep.Spec.Node, err)
		default:
			held = append(held, rep)
		}
	}
	return held, gone, nil
}

// replicaCache asks for a reconcile of a replica's Cache.
func replicaCache(_ context.Context, obj client.Object) []reconcile.Request {
	rep, ok := obj.(*v1alpha1.CacheReplica)
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: rep.Namespace, Name: rep.Spec.Cache}}}
}

// cachesOnNode asks for a reconcile of the Caches that a deleted Node
// held.
func (r *CacheReconciler) cachesOnNode(ctx context.Context, obj client.Object) []reconcile.Request {
	var replicas v1alpha1.CacheReplicaList
	if err := r.Client.List(ctx, &replicas, client.MatchingFields{indexReplicaNode: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing the replicas of a deleted Node", "node", obj.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(replicas.Items))
	for i := range replicas.Items {
		reqs = append(reqs, replicaCache(ctx, &replicas.Items[i])...)
	}
	return reqs
}

var nodeDeleted = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}
