package volumes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

var maven = layerfs.CacheRef{Namespace: "ci", Name: "maven"}

func getCache(t *testing.T, c client.Client, ref layerfs.CacheRef) *v1alpha1.Cache {
	t.Helper()
	var cache v1alpha1.Cache
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &cache); err != nil {
		t.Fatal(err)
	}
	return &cache
}

// getReplica returns node-a's replica of ref, or nil.
func getReplica(t *testing.T, c client.Client, ref layerfs.CacheRef) *v1alpha1.CacheReplica {
	t.Helper()
	return lookupReplica(t, c, ref, "node-a")
}

// replicaOf returns node's replica of ref, which must exist.
func replicaOf(t *testing.T, c client.Client, ref layerfs.CacheRef, node string) *v1alpha1.CacheReplica {
	t.Helper()
	r := lookupReplica(t, c, ref, node)
	if r == nil {
		t.Fatalf("no CacheReplica of %s on %s", ref, node)
	}
	return r
}

// lookupReplica returns node's replica of ref, or nil.
func lookupReplica(t *testing.T, c client.Client, ref layerfs.CacheRef, node string) *v1alpha1.CacheReplica {
	t.Helper()
	var r v1alpha1.CacheReplica
	err := c.Get(context.Background(), client.ObjectKey{Namespace: ref.Namespace, Name: v1alpha1.CacheReplicaName(ref.Name, node)}, &r)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &r
}

func TestReportAppliesAndDeletesReplica(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, nil, cacheObject("ci", "maven"))
	env.store.Cache(maven).Generation = 2
	env.store.Cache(maven).Bytes = 512
	env.store.Cache(maven).LastWriter = "ci/build-2"

	if err := env.maint.Report(ctx, maven); err != nil {
		t.Fatalf("report: %v", err)
	}
	r := getReplica(t, env.client, maven)
	if r == nil || r.Spec != (v1alpha1.CacheReplicaSpec{Cache: "maven", Node: "node-a"}) || r.Status.Generation != 2 || r.Status.SizeBytes != 512 || r.Status.LastWriter != "ci/build-2" {
		t.Fatalf("replica %+v, want node-a's of maven at generation 2", r)
	}
	if got := metricValue(t, env.maint.metrics.Generation.WithLabelValues("ci", "maven")); got != 2 {
		t.Errorf("generation gauge %v, want 2", got)
	}
	// An unchanged cache is not applied again.
	rv := r.ResourceVersion
	if err := env.maint.Report(ctx, maven); err != nil {
		t.Fatalf("report again: %v", err)
	}
	if again := getReplica(t, env.client, maven); again.ResourceVersion != rv {
		t.Errorf("an unchanged report rewrote the replica (resourceVersion %s, then %s)", rv, again.ResourceVersion)
	}

	// The cache leaves the node: the replica and the per-cache series go.
	delete(env.store.CacheByRef, maven)
	if err := env.maint.Report(ctx, maven); err != nil {
		t.Fatalf("report of a removed cache: %v", err)
	}
	if r := getReplica(t, env.client, maven); r != nil {
		t.Errorf("replica %+v after the cache left the node, want none", r)
	}
}

// TestReportBeforeTheInformer: a claim's first use creates the Cache and
// the provision reports it at once, before the informer has the Cache.
// The report reads the API server then, so the replica appears with the
// volume rather than at the next maintenance pass (the e2e quiet tests
// saw it appear minutes after a kept Workflow had failed).
func TestReportBeforeTheInformer(t *testing.T) {
	ctx := context.Background()
	informer := newCacheClient(t)
	api := newCacheClient(t, cacheObject("ci", "maven"))
	events := events.NewFakeRecorder(100)
	parts := testNodeParts(t, "node-a", "", kittest.NewFakeStore(), informer, events)
	parts.core.Caches.Reader = api
	env := newTestEnvOf(t, parts, informer, events)
	env.store.Cache(maven).Generation = 1

	if err := env.maint.Report(ctx, maven); err != nil {
		t.Fatalf("report: %v", err)
	}
	var r v1alpha1.CacheReplica
	if err := informer.Get(ctx, client.ObjectKey{Namespace: "ci", Name: v1alpha1.CacheReplicaName("maven", "node-a")}, &r); err != nil {
		t.Fatalf("no replica after reporting a Cache only the API server has: %v", err)
	}
	if r.Status.Generation != 1 {
		t.Errorf("replica at generation %d, want 1", r.Status.Generation)
	}
}

func TestReportWithoutCacheResource(t *testing.T) {
	// Caches made with the layerfs CLI have no resource; reporting them
	// must neither fail nor create one.
	env := newTestEnv(t, nil)
	env.store.Cache(maven)
	if err := env.maint.Report(context.Background(), maven); err != nil {
		t.Fatalf("report: %v", err)
	}
	var list v1alpha1.CacheList
	if err := env.client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("report created %v", list.Items)
	}
}

func TestReconcileDeletedCache(t *testing.T) {
	ctx := context.Background()
	live := cacheObject("ci", "live")
	env := newTestEnv(t, nil, deletingCache("ci", "maven"), live)
	env.store.Cache(maven).Generation = 1
	liveRef := layerfs.CacheRef{Namespace: "ci", Name: "live"}
	env.store.Cache(liveRef)
	if err := env.maint.caches.ApplyStatus(ctx, getCache(t, env.client, maven), layerfs.CacheInfo{Cache: maven, Generation: 1}, nil); err != nil {
		t.Fatal(err)
	}

	for _, ref := range []layerfs.CacheRef{maven, liveRef, {Namespace: "ci", Name: "gone"}} {
		req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}}
		if _, err := env.maint.Reconcile(ctx, req); err != nil {
			t.Fatalf("Reconcile %s: %v", ref, err)
		}
	}
	if len(env.store.Removed) != 1 || env.store.Removed[0] != maven {
		t.Errorf("removed %v, want only the deleted ci/maven", env.store.Removed)
	}
	if r := getReplica(t, env.client, maven); r != nil {
		t.Errorf("node-a's replica of the deleted Cache is still there: %+v", r)
	}
	// Reconciling again (the finalizer is still there) is harmless.
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ci", Name: "maven"}}
	if _, err := env.maint.Reconcile(ctx, req); err != nil {
		t.Errorf("second Reconcile: %v", err)
	}
}

func TestRetentionExceeded(t *testing.T) {
	now := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	gi := resource.MustParse("1Gi")
	ret := func(age time.Duration, size *resource.Quantity) *v1alpha1.Retention {
		r := &v1alpha1.Retention{MaxSize: size}
		if age > 0 {
			r.MaxAge = &metav1.Duration{Duration: age}
		}
		return r
	}
	tests := []struct {
		name string
		ret  *v1alpha1.Retention
		info layerfs.CacheInfo
		want bool
	}{
		{"no retention", nil, layerfs.CacheInfo{LastUsed: now.Add(-100 * day), Bytes: 1 << 40}, false},
		{"young", ret(7*day, nil), layerfs.CacheInfo{LastUsed: now.Add(-day)}, false},
		{"old", ret(7*day, nil), layerfs.CacheInfo{LastUsed: now.Add(-8 * day)}, true},
		{"small", ret(0, &gi), layerfs.CacheInfo{LastUsed: now, Bytes: 1 << 29}, false},
		{"big", ret(0, &gi), layerfs.CacheInfo{LastUsed: now, Bytes: 1<<30 + 1}, true},
	}
	for _, tt := range tests {
		why := retentionExceeded(tt.ret, tt.info, now)
		if (why != "") != tt.want {
			t.Errorf("%s: retentionExceeded = %q, want exceeded=%v", tt.name, why, tt.want)
		}
	}
}

func TestPass(t *testing.T) {
	ctx := context.Background()
	expired := func(name string) *v1alpha1.Cache {
		c := cacheObject("ci", name)
		c.Spec.Retention = &v1alpha1.Retention{MaxAge: &metav1.Duration{Duration: time.Hour}}
		return c
	}
	env := newTestEnv(t, nil, cacheObject("ci", "maven"), expired("old"), expired("busy"), expired("read"),
		deletingCache("ci", "doomed"), cacheObject("ci", "stale"))
	ref := func(name string) layerfs.CacheRef { return layerfs.CacheRef{Namespace: "ci", Name: name} }
	env.store.Cache(maven).LastUsed = time.Now()
	for _, name := range []string{"doomed", "stale", "orphan", "orphan-busy"} {
		env.store.Cache(ref(name))
	}
	// A build writes busy and orphan-busy (whose claim just made its
	// Cache); a reader only reads read.
	for vol, mount := range map[string]layerfs.MountOptions{
		"pvc-busy":        {Cache: ref("busy")},
		"pvc-orphan-busy": {Cache: ref("orphan-busy")},
		"pvc-read":        {Cache: ref("read"), ReadOnly: true},
	} {
		if _, err := env.store.Mount(ctx, vol, mount); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"old", "busy", "read"} {
		env.store.Cache(ref(name)).LastUsed = time.Now().Add(-2 * time.Hour)
	}
	env.store.GCRemoves = []layerfs.CacheRef{ref("stale")}
	if err := env.maint.caches.ApplyStatus(ctx, getCache(t, env.client, ref("stale")), layerfs.CacheInfo{Cache: ref("stale")}, nil); err != nil {
		t.Fatal(err)
	}

	env.maint.Pass(ctx)

	var removed []string
	for _, r := range env.store.Removed {
		removed = append(removed, r.Name)
	}
	slices.Sort(removed)
	// old and read by retention (a reader holds no cache), doomed as its
	// Cache is being deleted, orphan as its Cache is gone.
	if want := []string{"doomed", "old", "orphan", "read"}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	var retention int
	for _, ev := range env.drainEvents() {
		if strings.HasPrefix(ev, "Normal RetentionExceeded") && strings.Contains(ev, "maxAge") {
			retention++
		}
	}
	if retention != 2 {
		t.Errorf("%d RetentionExceeded Events, want 2 (old and read)", retention)
	}
	if r := getReplica(t, env.client, ref("stale")); r != nil {
		t.Errorf("GC removed ci/stale but its replica stayed: %+v", r)
	}
	// Surviving caches with a Cache resource are queued for a status report.
	if n := env.maint.reports.Queue.Len(); n != 2 {
		t.Errorf("report queue has %d items, want ci/maven and ci/busy", n)
	}
}

func TestSquashReports(t *testing.T) {
	env := newTestEnv(t, nil)
	deep := env.store.Cache(maven) // deeper than any squash limit
	for i := range 20 {
		deep.Layers = append(deep.Layers, layerfs.LayerInfo{ID: fmt.Sprintf("l%d", i)})
	}
	if err := env.maint.Squash(context.Background(), maven); err != nil {
		t.Fatal(err)
	}
	if len(env.store.Squashed) != 1 || env.maint.reports.Queue.Len() != 1 {
		t.Errorf("squashed %v, %d reports queued; want one squash and its report", env.store.Squashed, env.maint.reports.Queue.Len())
	}
}

func TestRemount(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, nil)
	mount := func(id string, mounted bool) {
		if _, err := env.store.Mount(ctx, id, layerfs.MountOptions{Cache: maven, Writer: "ci/p"}); err != nil {
			t.Fatal(err)
		}
		env.store.VolumeByID[id].Mounted = mounted
	}
	mount("pvc-bound", false)
	mount("pvc-mounted", true)
	mount("pvc-released", false)
	mount("pvc-other", false)
	env.store.Mounts = 0
	pv := func(name, node string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
		p := testPV(map[string]string{v1alpha1.AnnotationNode: node})
		p.Name = name
		p.Status.Phase = phase
		return p
	}
	pvs := []*corev1.PersistentVolume{
		pv("pvc-bound", "node-a", corev1.VolumeBound),
		pv("pvc-mounted", "node-a", corev1.VolumeBound),
		pv("pvc-released", "node-a", corev1.VolumeReleased),
		pv("pvc-other", "node-b", corev1.VolumeBound),
		pv("pvc-missing", "node-a", corev1.VolumeBound),
	}
	n := remount(ctx, env.store, env.events, env.prov.metrics, "node-a", "", pvs)
	if n != 1 || env.store.Mounts != 1 || !env.store.VolumeByID["pvc-bound"].Mounted {
		t.Errorf("remounted %d (%d mounts), want only pvc-bound", n, env.store.Mounts)
	}
	if env.store.VolumeByID["pvc-released"].Mounted || env.store.VolumeByID["pvc-other"].Mounted {
		t.Error("remounted a released PV or another node's PV")
	}
	env.wantEvent(t, "Warning RemountFailed", "pvc-missing")
}

func TestPassDeletesStaleReplicas(t *testing.T) {
	ctx := context.Background()
	gone := layerfs.CacheRef{Namespace: "ci", Name: "gone"}
	env := newTestEnv(t, nil, cacheObject("ci", "maven"), cacheObject("ci", "gone"))
	env.store.Cache(maven)
	for _, ref := range []layerfs.CacheRef{maven, gone} {
		if err := env.maint.caches.ApplyStatus(ctx, getCache(t, env.client, ref), layerfs.CacheInfo{Cache: ref, Generation: 1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	env.maint.Pass(ctx)
	if r := getReplica(t, env.client, gone); r != nil {
		t.Errorf("the replica of a cache not on the node survived: %+v", r)
	}
	if r := getReplica(t, env.client, maven); r == nil {
		t.Error("the replica of a cache on the node was deleted")
	}
}
