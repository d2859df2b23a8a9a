//go:build envtest

package cachemanager

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// createCacheWith creates a Cache with the given labels and cluster max
// age (nil: none).
func (a *apiTest) createCacheWith(name string, labels map[string]string, maxAge *time.Duration) *v1alpha1.Cache {
	a.t.Helper()
	c := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: name, Labels: labels}}
	if maxAge != nil {
		c.Spec.Retention = &v1alpha1.Retention{ClusterMaxAge: &metav1.Duration{Duration: *maxAge}}
	}
	if err := a.c.Create(a.ctx, c); err != nil {
		a.t.Fatalf("creating Cache %s: %v", name, err)
	}
	return c
}

// deletedCaches is the manager's layercache_caches_deleted_total of reason.
func (a *apiTest) deletedCaches(reason string) float64 {
	a.t.Helper()
	families, err := a.metrics.Gather()
	if err != nil {
		a.t.Fatalf("gathering the manager's metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "layercache_caches_deleted_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// exists reports nil while obj exists and is not being deleted.
func (a *apiTest) exists(obj client.Object) func(context.Context) error {
	return func(ctx context.Context) error {
		cur := obj.DeepCopyObject().(client.Object)
		if err := a.get(ctx, cur); err != nil {
			return err
		}
		if cur.GetDeletionTimestamp() != nil {
			return fmt.Errorf("%s is being deleted", cur.GetName())
		}
		return nil
	}
}

// TestEnvtestExpiredCachesAreDeleted: Caches past their cluster-wide max
// age (from their spec, or from the StorageClass that created them) are
// deleted when they expire, with an Expired Event, through nothing but
// the controller's own requeue: nothing else touches them after their
// creation. One with a longer max age stays. A negative max age is
// refused by the CRD.
func TestEnvtestExpiredCachesAreDeleted(t *testing.T) {
	a := newAPITest(t)
	class := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: a.ns + "-short"},
		Provisioner: v1alpha1.ProvisionerName,
		Parameters:  map[string]string{v1alpha1.ParamClusterMaxAge: "3s"},
	}
	if err := a.c.Create(a.ctx, class); err != nil {
		t.Fatalf("creating StorageClass %s: %v", class.Name, err)
	}
	a.clusterScoped = append(a.clusterScoped, class)
	a.startManager()

	short, long := 2*time.Second, time.Hour
	bySpec := a.createCacheWith("by-spec", nil, &short)
	byClass := a.createCacheWith("by-class", map[string]string{v1alpha1.LabelStorageClass: class.Name}, nil)
	// The spec wins over the class.
	kept := a.createCacheWith("kept", map[string]string{v1alpha1.LabelStorageClass: class.Name}, &long)

	a.eventually("the Cache with a 2s max age to be deleted", a.gone(bySpec))
	a.waitEvent("Cache", bySpec.Name, "Normal Expired Deleted the cache: no node has used it for ")
	a.eventually("the Cache of a class with a 3s max age to be deleted", a.gone(byClass))
	a.waitEvent("Cache", byClass.Name, "Normal Expired Deleted the cache")
	evs, err := a.events(a.ctx, "Cache", byClass.Name)
	if err != nil {
		t.Fatal(err)
	}
	if want := "past its cluster-wide max age 3s from StorageClass " + class.Name + "'s parameter clusterMaxAge"; !strings.Contains(strings.Join(evs, "\n"), want) {
		t.Errorf("events of Cache %s = %q, want one saying %q", byClass.Name, evs, want)
	}
	a.stays("the Cache with a 1h max age stays", a.exists(kept))
	if got := a.deletedCaches(deletedClusterMaxAge); got != 2 {
		t.Errorf("layercache_caches_deleted_total{reason=%q} = %v, want 2", deletedClusterMaxAge, got)
	}
	for _, c := range []*v1alpha1.Cache{bySpec, byClass} {
		path := fmt.Sprintf("/apis/layercache.dev/v1alpha1/namespaces/%s/caches/%s", a.ns, c.Name)
		if got := a.writes.to(path); !strings.Contains(strings.Join(got, " "), "DELETE "+path) {
			t.Errorf("the manager's writes to %s = %q, want a DELETE", path, got)
		}
	}

	negative := -time.Minute
	bad := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: "negative"},
		Spec: v1alpha1.CacheSpec{Retention: &v1alpha1.Retention{ClusterMaxAge: &metav1.Duration{Duration: negative}}}}
	err = a.c.Create(a.ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "clusterMaxAge must not be negative") {
		t.Errorf("creating a Cache with clusterMaxAge %s: %v, want the CRD's refusal", negative, err)
	}
}

// TestEnvtestNamespaceSizeEvictsTheLeastRecentlyUsed: three 1 MiB caches
// in a namespace bounded to 2.5 MiB: the least recently used (not the
// oldest) is deleted, with an Evicted Event, and the node agent then
// clears it as for any deleted Cache; the other two stay. Lowering the
// bound below the most recently used cache alone deletes all others and
// warns on the Namespace.
func TestEnvtestNamespaceSizeEvictsTheLeastRecentlyUsed(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	node := a.createNode(a.ns + "-a").Name
	// Uses count from the caches' creation, so the entries say they were
	// used after it: a, b, c used 30, 10 and 20 minutes from now; b is the
	// least recently used, not the oldest.
	now := time.Now()
	var caches []*v1alpha1.Cache
	for i, minutes := range []int{30, 10, 20} {
		c := a.createCache(string(rune('a'+i)), node)
		a.applyEntry(c, node, nodeEntry(1, 1<<20, now.Add(time.Duration(minutes)*time.Minute)))
		caches = append(caches, c)
	}
	a.stays("no bound, nothing is deleted", func(ctx context.Context) error {
		for _, c := range caches {
			if err := a.exists(c)(ctx); err != nil {
				return err
			}
		}
		return nil
	})

	a.annotateNamespace("2.5Mi")
	lru := caches[1]
	a.eventually("the least recently used cache to be deleted", func(ctx context.Context) error {
		if err := a.exists(lru)(ctx); err == nil {
			return fmt.Errorf("cache %s still exists", lru.Name)
		}
		return nil
	})
	a.waitEvent("Cache", lru.Name, fmt.Sprintf("Normal Evicted Deleted the cache (1.0MiB, last used %s), the least recently used of namespace %s: its caches took 3.0MiB, over the bound of 2.5MiB from annotation layercache.dev/max-cache-size on Namespace %s",
		now.Add(10*time.Minute).Truncate(time.Second).UTC().Format(time.RFC3339), a.ns, a.ns))
	// The node agent clears it and withdraws its entry; then it is gone.
	a.applyEntry(lru, node, nil)
	a.eventually("the evicted cache to be gone", a.gone(lru))
	a.stays("the two most recently used caches stay", func(ctx context.Context) error {
		for _, c := range []*v1alpha1.Cache{caches[0], caches[2]} {
			if err := a.exists(c)(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if got := a.deletedCaches(deletedNamespaceSize); got != 1 {
		t.Errorf("layercache_caches_deleted_total{reason=%q} = %v, want 1", deletedNamespaceSize, got)
	}

	// Below the most recently used cache's own size: c goes, a stays and
	// the Namespace gets a Warning.
	a.annotateNamespace("512Ki")
	a.eventually("the second least recently used cache to be deleted", func(ctx context.Context) error {
		if err := a.exists(caches[2])(ctx); err == nil {
			return fmt.Errorf("cache %s still exists", caches[2].Name)
		}
		return nil
	})
	a.eventually("a CacheSizeOverBound Warning on the Namespace", func(ctx context.Context) error {
		return a.namespaceEvent(ctx, "Warning CacheSizeOverBound Cache a alone takes 1.0MiB, over the namespace's bound of 512.0KiB")
	})
	a.stays("the most recently used cache stays", a.exists(caches[0]))
}

// annotateNamespace sets the test namespace's size bound.
func (a *apiTest) annotateNamespace(bound string) {
	a.t.Helper()
	var ns corev1.Namespace
	if err := a.c.Get(a.ctx, client.ObjectKey{Name: a.ns}, &ns); err != nil {
		a.t.Fatal(err)
	}
	patch := client.MergeFrom(ns.DeepCopy())
	metav1.SetMetaDataAnnotation(&ns.ObjectMeta, v1alpha1.AnnotationMaxCacheSize, bound)
	if err := a.c.Patch(a.ctx, &ns, patch); err != nil {
		a.t.Fatalf("annotating Namespace %s: %v", a.ns, err)
	}
}

// namespaceEvent reports nil once an Event about the test namespace starts
// with prefix. Events about a Namespace, which has no namespace, are in
// namespace default.
func (a *apiTest) namespaceEvent(ctx context.Context, prefix string) error {
	var list eventsv1.EventList
	if err := a.c.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		return fmt.Errorf("listing events: %w", err)
	}
	var seen []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "Namespace" && e.Regarding.Name == a.ns {
			s := e.Type + " " + e.Reason + " " + e.Note
			if strings.HasPrefix(s, prefix) {
				return nil
			}
			seen = append(seen, s)
		}
	}
	return fmt.Errorf("events about Namespace %s so far: %q", a.ns, seen)
}
