package cachemanager

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

const mib = 1 << 20

// sizedCache is a Cache with its replicas.
type sizedCache struct {
	*v1alpha1.Cache
	replicas []client.Object
}

// sized is a Cache of the test namespace with one replica per size, all
// last used sec seconds after t0.
func sized(name string, sec int, sizes ...int64) sizedCache {
	c := sizedCache{Cache: &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: *at(0)}}}
	for i, s := range sizes {
		c.replicas = append(c.replicas, replicaOf(name, "node-"+string(rune('a'+i)), v1alpha1.CacheReplicaStatus{Generation: 1, SizeBytes: s, LastUsed: at(sec)}))
	}
	return c
}

func namespace(annotations map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Annotations: annotations}}
}

func bounded(q string) map[string]string {
	return map[string]string{v1alpha1.AnnotationMaxCacheSize: q}
}

func TestNamespaceSizeReconcile(t *testing.T) {
	const fromAnnotation = "annotation layercache.dev/max-cache-size on Namespace " + ns
	deleting := sized("old", 1, 5*mib)
	deleting.Finalizers = []string{v1alpha1.FinalizerCleanup}
	deleting.DeletionTimestamp = at(2)
	tests := []struct {
		name       string
		ns         *corev1.Namespace
		defaultMax string
		caches     []sizedCache
		volumes    []*corev1.PersistentVolume
		pods       []*corev1.Pod
		gone       []string
		total      float64 // the total gauge after
		max        float64 // the bound gauge; -1 for no series
		events     []string
	}{{
		name:   "no bound: nothing is deleted, the total is reported",
		ns:     namespace(nil),
		caches: []sizedCache{sized("a", 10, mib), sized("b", 20, mib), sized("c", 30, mib)},
		total:  3 * mib, max: -1,
	}, {
		name:   "under the bound",
		ns:     namespace(bounded("3Mi")),
		caches: []sizedCache{sized("a", 10, mib), sized("b", 20, mib), sized("c", 30, mib)},
		total:  3 * mib, max: 3 * mib,
	}, {
		name:   "over the bound: the least recently used goes",
		ns:     namespace(bounded("2.5Mi")),
		caches: []sizedCache{sized("a", 30, mib), sized("b", 10, mib), sized("c", 20, mib)},
		gone:   []string{"b"},
		total:  2 * mib, max: 2.5 * mib,
		events: []string{"Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:10Z), the least recently used of namespace builds: its caches took 3.0MiB, over the bound of 2.5MiB from " + fromAnnotation},
	}, {
		name:   "as many go as it takes, oldest first",
		ns:     namespace(bounded("1.5Mi")),
		caches: []sizedCache{sized("a", 30, mib), sized("b", 10, mib), sized("c", 20, mib)},
		gone:   []string{"b", "c"},
		total:  mib, max: 1.5 * mib,
		events: []string{"Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:10Z)", "Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:20Z)"},
	}, {
		name:   "a cache counts its largest node copy",
		ns:     namespace(bounded("3Mi")),
		caches: []sizedCache{sized("a", 10, mib, 2*mib), sized("b", 20, mib, mib/2)},
		total:  3 * mib, max: 3 * mib,
	}, {
		name:   "the most recently used cache stays even alone over the bound",
		ns:     namespace(bounded("1Mi")),
		caches: []sizedCache{sized("big", 30, 3*mib), sized("small", 10, mib)},
		gone:   []string{"small"},
		total:  3 * mib, max: mib,
		events: []string{
			"Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:10Z), the least recently used of namespace builds: its caches took 4.0MiB, over the bound of 1.0MiB",
			"Warning CacheSizeOverBound Cache big alone takes 3.0MiB, over the namespace's bound of 1.0MiB from " + fromAnnotation + "; it is the most recently used cache",
		},
	}, {
		name:   "an empty cache frees nothing and stays",
		ns:     namespace(bounded("1.5Mi")),
		caches: []sizedCache{sized("empty", 5), sized("a", 10, mib), sized("b", 20, mib)},
		gone:   []string{"a"},
		total:  mib, max: 1.5 * mib,
		events: []string{"Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:10Z)"},
	}, {
		name:    "a cache a build is using is passed over",
		ns:      namespace(bounded("1.5Mi")),
		caches:  []sizedCache{sized("a", 10, mib), sized("b", 20, mib), sized("c", 30, mib)},
		volumes: []*corev1.PersistentVolume{volumeOf("pv-1", ns+"/a", "", corev1.VolumeBound)},
		gone:    []string{"b"},
		total:   2 * mib, max: 1.5 * mib,
		events: []string{"Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:20Z)"},
	}, {
		name:   "a cache a CSI build is writing is passed over",
		ns:     namespace(bounded("1.5Mi")),
		caches: []sizedCache{sized("a", 10, mib), sized("b", 20, mib), sized("c", 30, mib)},
		pods:   []*corev1.Pod{csiBuild("build", corev1.PodRunning, map[string]string{"cache": "a"})},
		gone:   []string{"b"},
		total:  2 * mib, max: 1.5 * mib,
		events: []string{"Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:20Z)"},
	}, {
		name:   "caches being deleted do not count",
		ns:     namespace(bounded("2.5Mi")),
		caches: []sizedCache{deleting, sized("a", 10, mib), sized("b", 20, mib)},
		total:  2 * mib, max: 2.5 * mib,
	}, {
		name:       "the manager's default bound",
		ns:         namespace(nil),
		defaultMax: "1.5Mi",
		caches:     []sizedCache{sized("a", 10, mib), sized("b", 20, mib)},
		gone:       []string{"a"},
		total:      mib, max: 1.5 * mib,
		events: []string{"Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:10Z), the least recently used of namespace builds: its caches took 2.0MiB, over the bound of 1.5MiB from the manager's --namespace-max-cache-size"},
	}, {
		name:       "the annotation wins over the default",
		ns:         namespace(bounded("10Mi")),
		defaultMax: "1Mi",
		caches:     []sizedCache{sized("a", 10, mib), sized("b", 20, mib)},
		total:      2 * mib, max: 10 * mib,
	}, {
		name:       "an invalid annotation is reported and the default applies",
		ns:         namespace(bounded("lots")),
		defaultMax: "1.5Mi",
		caches:     []sizedCache{sized("a", 10, mib), sized("b", 20, mib)},
		gone:       []string{"a"},
		total:      mib, max: 1.5 * mib,
		events: []string{
			`Warning InvalidAnnotation annotation layercache.dev/max-cache-size has value "lots": use a quantity above 0 such as "10Gi", or remove the annotation; until then the manager's bound of 1.5MiB applies`,
			"Normal Evicted Deleted the cache (1.0MiB, last used 2026-03-01T12:00:10Z)",
		},
	}, {
		name:   "a zero bound is invalid; without a default nothing is bounded",
		ns:     namespace(bounded("0")),
		caches: []sizedCache{sized("a", 10, mib), sized("b", 20, mib)},
		total:  2 * mib, max: -1,
		events: []string{`Warning InvalidAnnotation annotation layercache.dev/max-cache-size has value "0": use a quantity above 0 such as "10Gi", or remove the annotation; until then no bound applies`},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			objs := []client.Object{tc.ns.DeepCopy()}
			for _, c := range tc.caches {
				objs = append(append(objs, c.DeepCopy()), c.replicas...)
			}
			for _, pv := range tc.volumes {
				objs = append(objs, pv)
			}
			for _, pod := range tc.pods {
				objs = append(objs, pod)
			}
			c := newFakeClient(t, objs...)
			rec := events.NewFakeRecorder(10)
			metrics := testMetrics(t)
			r := &NamespaceSizeReconciler{Client: c, Recorder: rec, Metrics: metrics}
			if tc.defaultMax != "" {
				q := resource.MustParse(tc.defaultMax)
				r.DefaultMaxSize = &q
			}
			if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: ns}}); err != nil {
				t.Fatalf("Reconcile() error = %v", err)
			}
			var left v1alpha1.CacheList
			if err := c.List(ctx, &left, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			var gone []string
			for _, want := range tc.caches {
				if !slices.ContainsFunc(left.Items, func(c v1alpha1.Cache) bool { return c.Name == want.Name }) {
					gone = append(gone, want.Name)
				}
			}
			if !slices.Equal(gone, tc.gone) {
				t.Errorf("deleted caches %q, want %q", gone, tc.gone)
			}
			if got := counterValue(t, metrics.deletedCaches.WithLabelValues(deletedNamespaceSize)); got != float64(len(tc.gone)) {
				t.Errorf("deleted caches metric = %v, want %d", got, len(tc.gone))
			}
			if got := counterValue(t, metrics.namespaceBytes.WithLabelValues(ns)); got != tc.total {
				t.Errorf("namespace bytes = %v, want %v", got, tc.total)
			}
			if got := gaugeOrNone(t, metrics.namespaceMaxBytes); got != tc.max {
				t.Errorf("namespace max bytes = %v, want %v", got, tc.max)
			}
			checkEvents(t, drain(rec), tc.events...)
		})
	}
}

// gaugeOrNone is the gauge's value for the test namespace, or -1 if it has
// no series.
func gaugeOrNone(t *testing.T, g *prometheus.GaugeVec) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 10)
	g.Collect(ch)
	close(ch)
	for m := range ch {
		return counterValue(t, m)
	}
	return -1
}

// TestNamespaceSizeForgetsDeletedNamespaces: a deleted namespace's series
// go.
func TestNamespaceSizeForgetsDeletedNamespaces(t *testing.T) {
	metrics := testMetrics(t)
	metrics.setNamespace(ns, mib, &sizeBound{bytes: 2 * mib}, true)
	r := &NamespaceSizeReconciler{Client: newFakeClient(t), Recorder: events.NewFakeRecorder(1), Metrics: metrics}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*prometheus.GaugeVec{metrics.namespaceBytes, metrics.namespaceMaxBytes} {
		if got := gaugeOrNone(t, g); got != -1 {
			t.Errorf("a deleted namespace still has a series of value %v", got)
		}
	}
}
