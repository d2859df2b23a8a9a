package cachemanager

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

// NamespaceSizeReconciler bounds the total size of a namespace's caches:
// past the bound it deletes the least recently used caches until the rest
// fit. Each cache counts its largest node copy, what it takes on a node
// that holds all of it, so the bound does not depend on how many nodes
// happen to hold a cache. The most recently used cache is never deleted
// for the bound: it is the one the namespace's builds are using.
type NamespaceSizeReconciler struct {
	// Client reads from the informer cache (Namespaces, Caches) and
	// deletes through the API server.
	Client   client.Client
	Recorder events.EventRecorder
	Metrics  *Metrics
	// DefaultMaxSize is --namespace-max-cache-size, the bound of a
	// namespace without the annotation; nil is no bound.
	DefaultMaxSize *resource.Quantity
}

// SetupWithManager wires the controller: a Namespace is reconciled when it
// changes and when one of its Caches does (a replica's size change shows
// in its Cache's summary within seconds: watching the replicas themselves
// would reconcile a namespace on every commit of every node).
func (r *NamespaceSizeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("namespace-cache-size").
		For(&corev1.Namespace{}).
		Watches(&v1alpha1.Cache{}, handler.EnqueueRequestsFromMapFunc(cacheNamespace)).
		Complete(r)
}

func cacheNamespace(_ context.Context, obj client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: obj.GetNamespace()}}}
}

// sizeBound is a namespace's bound and the setting that gave it.
type sizeBound struct {
	bytes  int64
	source string
}

// cacheUse is a cache as the bound sees it.
type cacheUse struct {
	cache *v1alpha1.Cache
	size  int64
	used  time.Time
	// busy: a build has a volume of it that has not ended.
	busy bool
}

// Reconcile deletes the least recently used caches of a namespace over its
// bound and reports the namespace's total.
func (r *NamespaceSizeReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	namespace := req.Name
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, req.NamespacedName, &ns); err != nil {
		if apierrors.IsNotFound(err) {
			r.Metrics.forgetNamespace(namespace)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	bound := r.boundOf(&ns)
	var list v1alpha1.CacheList
	if err := r.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing the Caches of namespace %s: %w", namespace, err)
	}
	uses, err := r.cacheUses(ctx, list.Items)
	if err != nil {
		return reconcile.Result{}, err
	}
	total := totalSize(uses)
	if bound != nil {
		var err error
		if total, err = r.evict(ctx, &ns, uses, *bound); err != nil {
			return reconcile.Result{}, err
		}
	}
	r.Metrics.setNamespace(namespace, total, bound, len(uses) > 0)
	return reconcile.Result{}, nil
}

// evict deletes the caches that planEvictions picks and returns the total
// size of those left. A deletion the API server refuses (the cache
// changed) stops it: the change reconciles the namespace again.
func (r *NamespaceSizeReconciler) evict(ctx context.Context, ns *corev1.Namespace, uses []cacheUse, bound sizeBound) (int64, error) {
	total := totalSize(uses)
	victims, left := planEvictions(uses, bound.bytes)
	for _, v := range victims {
		deleted, err := deleteCache(ctx, r.Client, v.cache)
		if err != nil || !deleted {
			return total, err
		}
		r.Metrics.deletedCaches.WithLabelValues(deletedNamespaceSize).Inc()
		log.FromContext(ctx).Info("deleted the least recently used cache over the namespace's bound",
			"cache", v.cache.Name, "size", v.size, "total", total, "bound", bound.bytes, "source", bound.source)
		r.Recorder.Eventf(v.cache, nil, corev1.EventTypeNormal, "Evicted", "Delete",
			"Deleted the cache (%s, last used %s), the least recently used of namespace %s: its caches took %s, over the bound of %s from %s",
			v1alpha1.FormatSize(v.size), v.used.UTC().Format(time.RFC3339), ns.Name, v1alpha1.FormatSize(total), v1alpha1.FormatSize(bound.bytes), bound.source)
		total -= v.size
	}
	if left != nil {
		r.Recorder.Eventf(ns, nil, corev1.EventTypeWarning, "CacheSizeOverBound", "Evict",
			"Cache %s alone takes %s, over the namespace's bound of %s from %s; it is the most recently used cache, which is never deleted for the bound: raise the bound or delete the cache",
			left.cache.Name, v1alpha1.FormatSize(left.size), v1alpha1.FormatSize(bound.bytes), bound.source)
	}
	return total, nil
}

// planEvictions picks the caches to delete, least recently used first,
// until the rest fit in bound. The most recently used cache is never
// picked; if it alone is over the bound, it is returned as left.
// Caches that hold nothing on any node are not picked (deleting them frees
// nothing), nor caches a build is using (its commit would be dropped); the
// end of that build reconciles the namespace again.
func planEvictions(uses []cacheUse, bound int64) (victims []cacheUse, left *cacheUse) {
	if len(uses) == 0 {
		return nil, nil
	}
	order := slices.Clone(uses)
	slices.SortFunc(order, func(a, b cacheUse) int {
		if c := a.used.Compare(b.used); c != 0 {
			return c
		}
		return cmp.Compare(a.cache.Name, b.cache.Name)
	})
	total := totalSize(order)
	newest := order[len(order)-1]
	for _, u := range order[:len(order)-1] {
		if total <= bound {
			break
		}
		if u.size == 0 || u.busy {
			continue
		}
		victims = append(victims, u)
		total -= u.size
	}
	if total > bound && newest.size > bound {
		left = &newest
	}
	return victims, left
}

// cacheUses are the Caches that count: those not being deleted.
func (r *NamespaceSizeReconciler) cacheUses(ctx context.Context, caches []v1alpha1.Cache) ([]cacheUse, error) {
	var uses []cacheUse
	for i := range caches {
		c := &caches[i]
		if !c.DeletionTimestamp.IsZero() {
			continue
		}
		busy, err := inUse(ctx, r.Client, c)
		if err != nil {
			return nil, err
		}
		replicas, err := replicasOf(ctx, r.Client, c)
		if err != nil {
			return nil, err
		}
		uses = append(uses, cacheUse{cache: c, size: largestCopy(replicas), used: lastUsed(c, replicas), busy: busy})
	}
	return uses, nil
}

func totalSize(uses []cacheUse) int64 {
	var total int64
	for _, u := range uses {
		total += u.size
	}
	return total
}

// boundOf is the namespace's bound: its annotation, else the manager's
// default; nil for none. An invalid annotation gets a Warning Event and
// the default applies.
func (r *NamespaceSizeReconciler) boundOf(ns *corev1.Namespace) *sizeBound {
	def := r.defaultBound()
	v, ok := ns.Annotations[v1alpha1.AnnotationMaxCacheSize]
	if !ok {
		return def
	}
	q, err := resource.ParseQuantity(v)
	if err == nil && q.Sign() > 0 {
		return &sizeBound{bytes: q.Value(), source: fmt.Sprintf("annotation %s on Namespace %s", v1alpha1.AnnotationMaxCacheSize, ns.Name)}
	}
	instead := "no bound applies"
	if def != nil {
		instead = "the manager's bound of " + v1alpha1.FormatSize(def.bytes) + " applies"
	}
	r.Recorder.Eventf(ns, nil, corev1.EventTypeWarning, "InvalidAnnotation", "BoundCaches",
		"annotation %s has value %q: use a quantity above 0 such as \"10Gi\", or remove the annotation; until then %s",
		v1alpha1.AnnotationMaxCacheSize, v, instead)
	return def
}

func (r *NamespaceSizeReconciler) defaultBound() *sizeBound {
	if r.DefaultMaxSize == nil {
		return nil
	}
	return &sizeBound{bytes: r.DefaultMaxSize.Value(), source: "the manager's --namespace-max-cache-size"}
}
