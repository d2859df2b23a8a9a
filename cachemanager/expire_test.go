package cachemanager

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

// expiring is a Cache created at t0 for the expiry tests.
func expiring(opts ...func(*v1alpha1.Cache)) *v1alpha1.Cache {
	c := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "maven", CreationTimestamp: *at(0)}}
	for _, o := range opts {
		o(c)
	}
	return c
}

func withClusterMaxAge(d time.Duration) func(*v1alpha1.Cache) {
	return func(c *v1alpha1.Cache) {
		c.Spec.Retention = &v1alpha1.Retention{ClusterMaxAge: &metav1.Duration{Duration: d}}
	}
}

func withClass(name string) func(*v1alpha1.Cache) {
	return func(c *v1alpha1.Cache) { c.Labels = map[string]string{v1alpha1.LabelStorageClass: name} }
}

func withLastUsed(sec int) func(*v1alpha1.Cache) {
	return func(c *v1alpha1.Cache) { c.Status.LastUsed = at(sec) }
}

func classWithMaxAge(name, value string) *storagev1.StorageClass {
	return &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: name},
		Provisioner: v1alpha1.ProvisionerName,
		Parameters:  map[string]string{v1alpha1.ParamClusterMaxAge: value},
	}
}

func TestExpiryReconcile(t *testing.T) {
	const hour = 3600
	tests := []struct {
		name       string
		cache      *v1alpha1.Cache
		replicas   []*v1alpha1.CacheReplica
		classes    []*storagev1.StorageClass
		volumes    []*corev1.PersistentVolume
		pods       []*corev1.Pod
		defaultAge time.Duration
		now        int // seconds after t0
		deleted    bool
		requeue    time.Duration
		event      string // prefix of the one Event; "" for none
	}{{
		name:       "never used: counts from creation",
		cache:      expiring(),
		defaultAge: 720 * time.Hour, now: 719 * hour,
		requeue: time.Hour,
	}, {
		name:       "never used, past the default",
		cache:      expiring(),
		defaultAge: 720 * time.Hour, now: 720*hour + 5,
		deleted: true,
		event:   "Normal Expired Deleted the cache: no node has used it for 720h0m0s (since 2026-03-01T12:00:00Z), past its cluster-wide max age 720h0m0s from the manager's --cache-max-age",
	}, {
		name:       "the newest node use counts",
		cache:      expiring(),
		replicas:   []*v1alpha1.CacheReplica{replica("node-a", 1, gib, 10*hour), replica("node-b", 1, gib, 100*hour)},
		defaultAge: 720 * time.Hour, now: 800 * hour,
		requeue: 20 * time.Hour,
	}, {
		name:       "status.lastUsed counts without replicas",
		cache:      expiring(withLastUsed(100 * hour)),
		defaultAge: 720 * time.Hour, now: 810 * hour,
		requeue: 10 * time.Hour,
	}, {
		name:       "the spec wins over the class and the default",
		cache:      expiring(withClusterMaxAge(20*time.Second), withClass("short")),
		classes:    []*storagev1.StorageClass{classWithMaxAge("short", "1h")},
		defaultAge: 720 * time.Hour, now: 21,
		deleted: true,
		event:   "Normal Expired Deleted the cache: no node has used it for 21s (since 2026-03-01T12:00:00Z), past its cluster-wide max age 20s from the Cache's spec.retention.clusterMaxAge",
	}, {
		name:       "spec 0s keeps the cache forever",
		cache:      expiring(withClusterMaxAge(0), withClass("short")),
		classes:    []*storagev1.StorageClass{classWithMaxAge("short", "1h")},
		defaultAge: time.Hour, now: 10000 * hour,
	}, {
		name:       "the class wins over the default",
		cache:      expiring(withClass("short")),
		classes:    []*storagev1.StorageClass{classWithMaxAge("short", "1h")},
		defaultAge: 720 * time.Hour, now: 2 * hour,
		deleted: true,
		event:   "Normal Expired Deleted the cache: no node has used it for 2h0m0s (since 2026-03-01T12:00:00Z), past its cluster-wide max age 1h0m0s from StorageClass short's parameter clusterMaxAge",
	}, {
		name:       "class 0s keeps the cache forever",
		cache:      expiring(withClass("keep")),
		classes:    []*storagev1.StorageClass{classWithMaxAge("keep", "0s")},
		defaultAge: time.Hour, now: 10000 * hour,
	}, {
		name:       "an invalid class value falls back to the default",
		cache:      expiring(withClass("bad")),
		classes:    []*storagev1.StorageClass{classWithMaxAge("bad", "-1h")},
		defaultAge: 10 * time.Hour, now: 9 * hour,
		requeue: time.Hour,
	}, {
		name:       "a deleted class falls back to the default",
		cache:      expiring(withClass("gone")),
		defaultAge: 10 * time.Hour, now: 9 * hour,
		requeue: time.Hour,
	}, {
		name:       "a build still running keeps an expired cache",
		cache:      expiring(),
		volumes:    []*corev1.PersistentVolume{volumeOf("pv-1", ns+"/maven", "", corev1.VolumeBound)},
		defaultAge: 720 * time.Hour, now: 800 * hour,
		requeue: busyRecheck,
	}, {
		name:  "ended builds and other caches' builds do not",
		cache: expiring(),
		volumes: []*corev1.PersistentVolume{
			volumeOf("pv-1", ns+"/maven", v1alpha1.ResultCommitted, corev1.VolumeBound),
			volumeOf("pv-2", ns+"/maven", "", corev1.VolumeReleased),
			volumeOf("pv-3", ns+"/npm", "", corev1.VolumeBound),
		},
		defaultAge: time.Hour, now: 2 * hour,
		deleted: true,
		event:   "Normal Expired Deleted the cache: no node has used it for 2h0m0s",
	}, {
		// Issue 33, finding 5: a CSI build has no PV, so its cache was
		// deleted under it and its commit dropped.
		name:       "a CSI build still running keeps an expired cache",
		cache:      expiring(),
		pods:       []*corev1.Pod{csiBuild("build", corev1.PodRunning, map[string]string{"cache": "maven"})},
		defaultAge: 720 * time.Hour, now: 800 * hour,
		requeue: busyRecheck,
	}, {
		name:       "a CSI build about to start keeps it",
		cache:      expiring(),
		pods:       []*corev1.Pod{csiBuild("build", corev1.PodPending, map[string]string{"cache": ns + "/maven"})},
		defaultAge: time.Hour, now: 2 * hour,
		requeue: busyRecheck,
	}, {
		name:       "a CSI build that ended keeps it until the agent has ended its volume",
		cache:      expiring(),
		pods:       []*corev1.Pod{csiBuild("build", corev1.PodSucceeded, map[string]string{"cache": "maven"}, v1alpha1.FinalizerBuildEnd)},
		defaultAge: time.Hour, now: 2 * hour,
		requeue: busyRecheck,
	}, {
		name:  "kept CSI pods, read views and other caches' CSI builds do not",
		cache: expiring(),
		pods: []*corev1.Pod{
			csiBuild("kept", corev1.PodSucceeded, map[string]string{"cache": "maven"}),
			csiBuild("reader", corev1.PodRunning, map[string]string{"cache": "maven", "mode": "read"}),
			readOnly(csiBuild("read-only", corev1.PodRunning, map[string]string{"cache": "maven"})),
			csiBuild("other", corev1.PodRunning, map[string]string{"cache": "npm"}),
		},
		defaultAge: time.Hour, now: 2 * hour,
		deleted: true,
		event:   "Normal Expired Deleted the cache: no node has used it for 2h0m0s",
	}, {
		name:       "default 0 keeps caches forever",
		cache:      expiring(),
		defaultAge: 0, now: 10000 * hour,
	}, {
		name: "a cache being deleted is left to the cleanup",
		cache: expiring(func(c *v1alpha1.Cache) {
			c.Finalizers = []string{v1alpha1.FinalizerCleanup}
			c.DeletionTimestamp = at(5)
		}),
		defaultAge: time.Hour, now: 10 * hour,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			objs := []client.Object{tc.cache.DeepCopy()}
			for _, r := range tc.replicas {
				objs = append(objs, r)
			}
			for _, sc := range tc.classes {
				objs = append(objs, sc)
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
			r := &ExpiryReconciler{Client: c, Recorder: rec, Metrics: metrics, DefaultMaxAge: tc.defaultAge,
				Now: func() time.Time { return at(tc.now).Time }}
			res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tc.cache)})
			if err != nil {
				t.Fatalf("Reconcile() error = %v", err)
			}
			if res.RequeueAfter != tc.requeue {
				t.Errorf("requeue after %v, want %v", res.RequeueAfter, tc.requeue)
			}
			var got v1alpha1.Cache
			err = c.Get(ctx, client.ObjectKeyFromObject(tc.cache), &got)
			if deleted := apierrors.IsNotFound(err); deleted != tc.deleted {
				t.Errorf("cache deleted = %v (err %v), want %v", deleted, err, tc.deleted)
			}
			if got := counterValue(t, metrics.deletedCaches.WithLabelValues(deletedClusterMaxAge)); got != boolCount(tc.deleted) {
				t.Errorf("deleted caches metric = %v, want %v", got, boolCount(tc.deleted))
			}
			checkEvents(t, drain(rec), tc.event)
		})
	}
}

// TestExpiryStaleCacheIsNotDeleted: a decision taken on an old copy of the
// Cache (a node used it since) deletes nothing; the resourceVersion
// precondition refuses.
func TestExpiryStaleCacheIsNotDeleted(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, expiring())
	var stale v1alpha1.Cache
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "maven"}, &stale); err != nil {
		t.Fatal(err)
	}
	used := stale.DeepCopy()
	used.Status.LastUsed = at(1000)
	if err := c.Status().Update(ctx, used); err != nil {
		t.Fatal(err)
	}
	deleted, err := deleteCache(ctx, c, &stale)
	if err != nil || deleted {
		t.Fatalf("deleteCache(stale) = %v, %v; want a refusal, no error", deleted, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(used), &v1alpha1.Cache{}); err != nil {
		t.Fatalf("the used cache is gone: %v", err)
	}
}

// TestCachesOfClass: a StorageClass's change reconciles the Caches it
// created, and no others.
func TestCachesOfClass(t *testing.T) {
	short := expiring(withClass("short"))
	other := expiring(withClass("long"))
	other.Name = "npm"
	plain := expiring()
	plain.Name = "gradle"
	r := &ExpiryReconciler{Client: newFakeClient(t, short, other, plain)}
	got := r.cachesOfClass(context.Background(), classWithMaxAge("short", "1h"))
	if len(got) != 1 || got[0].Name != "maven" {
		t.Errorf("cachesOfClass(short) = %v, want [%s/maven]", got, ns)
	}
}

func boolCount(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// checkEvents checks that exactly one Event starting with want was
// recorded, or none if want is empty.
func checkEvents(t *testing.T, got []string, want ...string) {
	t.Helper()
	var wants []string
	for _, w := range want {
		if w != "" {
			wants = append(wants, w)
		}
	}
	if len(got) != len(wants) {
		t.Fatalf("events = %q, want %d starting with %q", got, len(wants), wants)
	}
	for i, w := range wants {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("event %d = %q\nwant it to start with %q", i, got[i], w)
		}
	}
}

// counterValue reads a counter or gauge.
func counterValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	if out.Gauge != nil {
		return out.Gauge.GetValue()
	}
	return out.Counter.GetValue()
}

// volumeOf is a layercache PV of cache (NAMESPACE/NAME) in phase, with the
// build's result ("" while it runs).
func volumeOf(name, cache, result string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			v1alpha1.AnnotationCache: cache, v1alpha1.AnnotationNode: "node-a",
		}},
		Status: corev1.PersistentVolumeStatus{Phase: phase},
	}
	if result != "" {
		pv.Annotations[v1alpha1.AnnotationResult] = result
	}
	return pv
}

// csiBuild is a pod of the test namespace with one layercache CSI inline
// volume of the given attributes.
func csiBuild(name string, phase corev1.PodPhase, attrs map[string]string, finalizers ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid"), Finalizers: finalizers},
		Spec: corev1.PodSpec{NodeName: "node-a", Volumes: []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
			CSI: &corev1.CSIVolumeSource{Driver: v1alpha1.CSIDriverName, VolumeAttributes: attrs},
		}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func readOnly(pod *corev1.Pod) *corev1.Pod {
	pod.Spec.Volumes[0].CSI.ReadOnly = new(true)
	return pod
}

func TestOpenVolumesIndex(t *testing.T) {
	foreign := volumeOf("pv-x", ns+"/maven", "", corev1.VolumeBound)
	// Issue 33, finding 10: a granted reader's open read volume kept the
	// owner's cache from expiry and its namespace's size bound.
	reader := volumeOf("pv-r", ns+"/maven", "", corev1.VolumeBound)
	reader.Annotations[v1alpha1.AnnotationMode] = string(v1alpha1.ModeRead)
	writer := volumeOf("pv-w", ns+"/maven", "", corev1.VolumeBound)
	writer.Annotations[v1alpha1.AnnotationMode] = string(v1alpha1.ModeWrite)
	foreign.Annotations = map[string]string{v1alpha1.AnnotationCache: ns + "/maven"} // not made by a node agent
	tests := []struct {
		pv   *corev1.PersistentVolume
		want []string
	}{
		{volumeOf("pv-1", ns+"/maven", "", corev1.VolumeBound), []string{ns + "/maven"}},
		{volumeOf("pv-2", ns+"/maven", v1alpha1.ResultDiscarded, corev1.VolumeBound), nil},
		{volumeOf("pv-3", ns+"/maven", "", corev1.VolumeReleased), nil},
		{foreign, nil},
		{reader, nil},
		{writer, []string{ns + "/maven"}},
	}
	for _, tt := range tests {
		if got := openVolumesIndex(tt.pv); !slices.Equal(got, tt.want) {
			t.Errorf("openVolumesIndex(%s) = %q, want %q", tt.pv.Name, got, tt.want)
		}
	}
}
