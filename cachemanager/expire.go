package cachemanager

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

// ExpiryReconciler deletes a Cache that no node has used for its
// cluster-wide max age. The node agents then clear it from their nodes,
// as for any deleted Cache (cache.go).
//
// Each Cache is requeued for the moment it expires, so the manager reads
// nothing while caches are young: no periodic sweep over every Cache. A
// use in between changes the Cache's status, which reconciles it again
// and moves its expiry.
type ExpiryReconciler struct {
	// Client reads from the informer cache (Caches, StorageClasses) and
	// deletes through the API server.
	Client   client.Client
	Recorder events.EventRecorder
	Metrics  *Metrics
	// DefaultMaxAge is --cache-max-age: the max age of a Cache whose spec
	// and StorageClass set none; 0 keeps them.
	DefaultMaxAge time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// SetupWithManager wires the controller: a Cache is reconciled when it
// changes, and the Caches a StorageClass created when the class changes.
func (r *ExpiryReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("cache-expiry").
		For(&v1alpha1.Cache{}).
		Watches(&storagev1.StorageClass{}, handler.EnqueueRequestsFromMapFunc(r.cachesOfClass)).
		Complete(r)
}

// busyRecheck is how soon an expired Cache with a running build is looked
// at again.
const busyRecheck = 10 * time.Minute

// maxAge is a Cache's cluster-wide max age and the setting that gave it.
type maxAge struct {
	age    time.Duration
	source string
}

// Reconcile deletes the Cache if it expired, else requeues it for when it
// expires.
func (r *ExpiryReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var c v1alpha1.Cache
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	limit, err := r.maxAgeOf(ctx, &c)
	if err != nil || limit.age == 0 {
		return reconcile.Result{}, err
	}
	replicas, err := replicasOf(ctx, r.Client, &c)
	if err != nil {
		return reconcile.Result{}, err
	}
	used := lastUsed(&c, replicas)
	now := r.now()
	if wait := used.Add(limit.age).Sub(now); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	busy, err := inUse(ctx, r.Client, &c)
	if err != nil {
		return reconcile.Result{}, err
	}
	if busy {
		// The build's commit or end brings the Cache back sooner if it
		// records a use; a discard does not, hence the requeue.
		log.FromContext(ctx).Info("a cache past its cluster-wide max age has a build running; keeping it", "maxAge", limit.age, "source", limit.source)
		return reconcile.Result{RequeueAfter: min(limit.age, busyRecheck)}, nil
	}
	deleted, err := deleteCache(ctx, r.Client, &c)
	if err != nil || !deleted {
		return reconcile.Result{}, err
	}
	r.Metrics.deletedCaches.WithLabelValues(deletedClusterMaxAge).Inc()
	age := roundAge(now.Sub(used))
	log.FromContext(ctx).Info("deleted a cache past its cluster-wide max age", "unused", age, "maxAge", limit.age, "source", limit.source)
	r.Recorder.Eventf(&c, nil, corev1.EventTypeNormal, "Expired", "Delete",
		"Deleted the cache: no node has used it for %s (since %s), past its cluster-wide max age %s from %s",
		age, used.UTC().Format(time.RFC3339), limit.age, limit.source)
	return reconcile.Result{}, nil
}

// maxAgeOf is the Cache's max age: its spec.retention.clusterMaxAge, else
// the clusterMaxAge parameter of the StorageClass that created it, else
// the manager's default.
func (r *ExpiryReconciler) maxAgeOf(ctx context.Context, c *v1alpha1.Cache) (maxAge, error) {
	if ret := c.Spec.Retention; ret != nil && ret.ClusterMaxAge != nil {
		// The CRD refuses negative ages; should one get past it, keeping
		// the cache is the harmless reading.
		return maxAge{age: max(ret.ClusterMaxAge.Duration, 0), source: "the Cache's spec.retention.clusterMaxAge"}, nil
	}
	if name := c.Labels[v1alpha1.LabelStorageClass]; name != "" {
		var class storagev1.StorageClass
		err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &class)
		switch {
		case apierrors.IsNotFound(err):
			// A deleted class decides nothing any more.
		case err != nil:
			return maxAge{}, fmt.Errorf("reading StorageClass %s of Cache %s/%s: %w", name, c.Namespace, c.Name, err)
		default:
			if v, ok := class.Parameters[v1alpha1.ParamClusterMaxAge]; ok {
				age, err := v1alpha1.ParseClusterMaxAge(v)
				if err == nil {
					return maxAge{age: age, source: fmt.Sprintf("StorageClass %s's parameter %s", name, v1alpha1.ParamClusterMaxAge)}, nil
				}
				// The node agents refuse the class's claims with this
				// error; the manager falls back to its default.
				log.FromContext(ctx).Info("ignoring an invalid StorageClass parameter", "class", name, "error", err.Error())
			}
		}
	}
	return maxAge{age: r.DefaultMaxAge, source: "the manager's --cache-max-age"}, nil
}

func (r *ExpiryReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// cachesOfClass returns the Caches that the StorageClass created.
func (r *ExpiryReconciler) cachesOfClass(ctx context.Context, obj client.Object) []reconcile.Request {
	var caches v1alpha1.CacheList
	if err := r.Client.List(ctx, &caches, client.MatchingLabels{v1alpha1.LabelStorageClass: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing the Caches of a StorageClass", "class", obj.GetName())
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
