package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

var maven = layerfs.CacheRef{Namespace: "ci", Name: "maven"}

func TestStatusApply(t *testing.T) {
	used := time.Date(2026, 3, 1, 12, 30, 45, 999, time.UTC)
	info := layerfs.CacheInfo{Cache: maven, Generation: 3, Layers: make([]layerfs.LayerInfo, 2), Bytes: 4096, LastUsed: used, LastWriter: "ci/build-1"}
	entry := nodeStatus("node-a", info, nil)
	got, err := json.Marshal(statusApply(maven, &entry))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kind":"Cache","apiVersion":"layercache.dev/v1alpha1","metadata":{"name":"maven","namespace":"ci"},` +
		`"status":{"nodes":[{"node":"node-a","generation":3,"layers":2,"sizeBytes":4096,"lastUsed":"2026-03-01T12:30:45Z","lastWriter":"ci/build-1"}]}}`
	if string(got) != want {
		t.Errorf("apply body\n got %s\nwant %s", got, want)
	}

	// Withdrawing states no status at all, so server-side apply removes
	// what this field manager applied before and nothing else.
	if withdraw := statusApply(maven, nil); withdraw.Status != nil {
		t.Errorf("withdraw body has a status: %+v", withdraw.Status)
	}

	// A copy created on a fallback's layers says which, at which
	// generation; the manager derives status.seededFrom from it.
	info.SeededFrom = &layerfs.Seed{Cache: layerfs.CacheRef{Namespace: "trusted", Name: "main"}, Generation: 7}
	entry = nodeStatus("node-a", info, nil)
	got, err = json.Marshal(entry.SeededFrom)
	if want := `{"namespace":"trusted","name":"main","generation":7}`; err != nil || string(got) != want {
		t.Errorf("seededFrom = %s, %v; want %s", got, err, want)
	}
}

func getCache(t *testing.T, c client.Client, ref layerfs.CacheRef) *v1alpha1.Cache {
	t.Helper()
	var cache v1alpha1.Cache
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &cache); err != nil {
		t.Fatal(err)
	}
	return &cache
}

func TestReportAppliesAndWithdrawsStatus(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, nil, cacheObject("ci", "maven"))
	env.store.cache(maven).Generation = 2
	env.store.cache(maven).Bytes = 512
	env.store.cache(maven).LastWriter = "ci/build-2"

	if err := env.maint.report(ctx, maven); err != nil {
		t.Fatalf("report: %v", err)
	}
	nodes := getCache(t, env.client, maven).Status.Nodes
	if len(nodes) != 1 || nodes[0].Node != "node-a" || nodes[0].Generation != 2 || nodes[0].SizeBytes != 512 || nodes[0].LastWriter != "ci/build-2" {
		t.Fatalf("status nodes %+v, want node-a at generation 2", nodes)
	}
	if got := metricValue(t, env.maint.metrics.generation.WithLabelValues("ci", "maven")); got != 2 {
		t.Errorf("generation gauge %v, want 2", got)
	}

	// The cache leaves the node: the entry and the per-cache series go.
	delete(env.store.caches, maven)
	if err := env.maint.report(ctx, maven); err != nil {
		t.Fatalf("report of a removed cache: %v", err)
	}
	if nodes := getCache(t, env.client, maven).Status.Nodes; len(nodes) != 0 {
		t.Errorf("status nodes %+v after the cache left the node, want none", nodes)
	}
}

// A report states the summary fields with the node's entry, as the
// manager would derive them from the whole status, so the manager has
// nothing left to write. (The fake client's server-side apply replaces
// lists whole, so the pure part is tested here and the merge in e2e.)
func TestReportStatesTheSummary(t *testing.T) {
	used := metav1.NewTime(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	cache := cacheObject("ci", "maven")
	cache.Status.Nodes = []v1alpha1.NodeCacheStatus{{Node: "node-b", Generation: 3, SizeBytes: 1024, LastUsed: &used},
		{Node: "node-a", Generation: 4, SizeBytes: 1}}
	mine := v1alpha1.NodeCacheStatus{Node: "node-a", Generation: 5, SizeBytes: 2048}
	whole := v1alpha1.CacheStatus{Nodes: []v1alpha1.NodeCacheStatus{cache.Status.Nodes[0], mine}}
	tests := []struct {
		name  string
		entry *v1alpha1.NodeCacheStatus
		want  v1alpha1.CacheStatus
	}{
		{"stated", &mine, whole.Summarized(nil)},
		{"withdrawn", nil, v1alpha1.CacheStatus{Nodes: whole.Nodes[:1]}.Summarized(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := withSummary(statusApply(maven, tt.entry), cache, "node-a", tt.entry).Status
			if got.Generation != tt.want.Generation || got.Size != tt.want.Size || got.NodeCount != tt.want.NodeCount ||
				!got.LastUsed.Equal(tt.want.LastUsed) || got.SeededFrom != tt.want.SeededFrom {
				t.Errorf("summary stated %+v, want that of %+v", got, tt.want)
			}
		})
	}
}

func TestReportWithoutCacheResource(t *testing.T) {
	// Caches made with the layerfs CLI have no resource; reporting them
	// must neither fail nor create one.
	env := newTestEnv(t, nil)
	env.store.cache(maven)
	if err := env.maint.report(context.Background(), maven); err != nil {
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
	env.store.cache(maven).Generation = 1
	liveRef := layerfs.CacheRef{Namespace: "ci", Name: "live"}
	env.store.cache(liveRef)
	if err := env.maint.caches.applyStatus(ctx, layerfs.CacheInfo{Cache: maven, Generation: 1}, nil); err != nil {
		t.Fatal(err)
	}

	for _, ref := range []layerfs.CacheRef{maven, liveRef, {Namespace: "ci", Name: "gone"}} {
		req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}}
		if _, err := env.maint.Reconcile(ctx, req); err != nil {
			t.Fatalf("Reconcile %s: %v", ref, err)
		}
	}
	if len(env.store.removed) != 1 || env.store.removed[0] != maven {
		t.Errorf("removed %v, want only the deleted ci/maven", env.store.removed)
	}
	if nodes := getCache(t, env.client, maven).Status.Nodes; len(nodes) != 0 {
		t.Errorf("entry of node-a still on the deleted Cache: %+v", nodes)
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
	env.store.cache(maven).LastUsed = time.Now()
	for _, name := range []string{"doomed", "stale", "orphan", "orphan-busy"} {
		env.store.cache(ref(name))
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
		env.store.cache(ref(name)).LastUsed = time.Now().Add(-2 * time.Hour)
	}
	env.store.gcRemoves = []layerfs.CacheRef{ref("stale")}
	if err := env.maint.caches.applyStatus(ctx, layerfs.CacheInfo{Cache: ref("stale")}, nil); err != nil {
		t.Fatal(err)
	}

	env.maint.pass(ctx)

	var removed []string
	for _, r := range env.store.removed {
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
	if nodes := getCache(t, env.client, ref("stale")).Status.Nodes; len(nodes) != 0 {
		t.Errorf("GC removed ci/stale but its status entry stayed: %+v", nodes)
	}
	// Surviving caches with a Cache resource are queued for a status report.
	if n := env.maint.reports.queue.Len(); n != 2 {
		t.Errorf("report queue has %d items, want ci/maven and ci/busy", n)
	}
}

func TestSquashReports(t *testing.T) {
	env := newTestEnv(t, nil)
	deep := env.store.cache(maven) // deeper than any squash limit
	for i := range 20 {
		deep.Layers = append(deep.Layers, layerfs.LayerInfo{ID: fmt.Sprintf("l%d", i)})
	}
	if err := env.maint.squash(context.Background(), maven); err != nil {
		t.Fatal(err)
	}
	if len(env.store.squashed) != 1 || env.maint.reports.queue.Len() != 1 {
		t.Errorf("squashed %v, %d reports queued; want one squash and its report", env.store.squashed, env.maint.reports.queue.Len())
	}
}

func TestRemount(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, nil)
	mount := func(id string, mounted bool) {
		if _, err := env.store.Mount(ctx, id, layerfs.MountOptions{Cache: maven, Writer: "ci/p"}); err != nil {
			t.Fatal(err)
		}
		env.store.volumes[id].Mounted = mounted
	}
	mount("pvc-bound", false)
	mount("pvc-mounted", true)
	mount("pvc-released", false)
	mount("pvc-other", false)
	env.store.mounts = 0
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
	n := remount(ctx, env.store, env.events, env.prov.metrics, "node-a", pvs)
	if n != 1 || env.store.mounts != 1 || !env.store.volumes["pvc-bound"].Mounted {
		t.Errorf("remounted %d (%d mounts), want only pvc-bound", n, env.store.mounts)
	}
	if env.store.volumes["pvc-released"].Mounted || env.store.volumes["pvc-other"].Mounted {
		t.Error("remounted a released PV or another node's PV")
	}
	env.wantEvent(t, "Warning RemountFailed", "pvc-missing")
}

func TestPassWithdrawsStaleEntries(t *testing.T) {
	ctx := context.Background()
	gone := layerfs.CacheRef{Namespace: "ci", Name: "gone"}
	env := newTestEnv(t, nil, cacheObject("ci", "maven"), cacheObject("ci", "gone"))
	env.store.cache(maven)
	for _, ref := range []layerfs.CacheRef{maven, gone} {
		if err := env.maint.caches.applyStatus(ctx, layerfs.CacheInfo{Cache: ref, Generation: 1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	env.maint.pass(ctx)
	if nodes := getCache(t, env.client, gone).Status.Nodes; len(nodes) != 0 {
		t.Errorf("entry of a cache not on the node survived: %+v", nodes)
	}
	if nodes := getCache(t, env.client, maven).Status.Nodes; len(nodes) != 1 {
		t.Errorf("entry of a cache on the node was withdrawn: %+v", nodes)
	}
}

// A report sends nothing when the Cache already holds the node's entry as
// the API server stores it (times to the second): the periodic pass then
// writes nothing, and takes no share of a summary another node changed.
func TestHoldsEntry(t *testing.T) {
	used := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	stored := v1alpha1.NodeCacheStatus{Node: "node-a", Generation: 2, SizeBytes: 512, LastUsed: &metav1.Time{Time: used}}
	cache := cacheObject("ci", "maven")
	cache.Status.Nodes = []v1alpha1.NodeCacheStatus{{Node: "node-b", Generation: 2}, stored}
	same := stored
	same.LastUsed = &metav1.Time{Time: used.Add(999 * time.Millisecond)}
	newer := stored
	newer.Generation = 3
	tests := []struct {
		name  string
		node  string
		entry *v1alpha1.NodeCacheStatus
		want  bool
	}{
		{"the stored entry, to the second", "node-a", &same, true},
		{"a new generation", "node-a", &newer, false},
		{"withdrawing a stored entry", "node-a", nil, false},
		{"withdrawing an entry that is not there", "node-c", nil, true},
		{"an entry that is not there", "node-c", &v1alpha1.NodeCacheStatus{Node: "node-c"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := holdsEntry(cache, tt.node, tt.entry); got != tt.want {
				t.Errorf("holdsEntry = %v, want %v", got, tt.want)
			}
		})
	}
}
