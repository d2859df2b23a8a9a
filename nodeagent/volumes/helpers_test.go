package volumes

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
	"github.com/layercache/layercache/nodeagent/registrysync"
	"github.com/layercache/layercache/remote"
)

func testScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	s, err := bootstrap.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newCacheClient is a controller-runtime fake client holding Caches.
func newCacheClient(t testing.TB, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(testScheme(t)).
		WithObjects(objs...).WithStatusSubresource(&v1alpha1.Cache{}).Build()
}

func testMetrics(t testing.TB) *kit.Metrics {
	t.Helper()
	m, err := kit.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testEnv is a provisioner for node-a over a fake store and a fake API.
type testEnv struct {
	core   *Core
	prov   *Provisioner
	maint  *Maintainer
	sync   *registrysync.Syncer
	store  *kittest.FakeStore
	client client.Client
	events *events.FakeRecorder
}

func newTestEnv(t testing.TB, st kit.Store, objs ...client.Object) *testEnv {
	t.Helper()
	if st == nil {
		st = kittest.NewFakeStore()
	}
	c := newCacheClient(t, objs...)
	events := events.NewFakeRecorder(100)
	// The fake store's volumes are nowhere: no mount gate (gate_test.go
	// tests it on a tmpfs of its own).
	return newTestEnvOf(t, testNodeParts(t, "node-a", "", st, c, events), c, events)
}

// newTestEnvOf is the node parts make, over the API c.
func newTestEnvOf(t testing.TB, parts nodeParts, c client.Client, events *events.FakeRecorder) *testEnv {
	t.Helper()
	fs, _ := parts.core.Store.(*kittest.FakeStore)
	core, sync := parts.build(t)
	return &testEnv{core: core, prov: core.prov, maint: core.maint, sync: sync, store: fs, client: c, events: events}
}

// nodeParts are what a test node's core and registry sync are made of;
// a test may change them before build makes the node.
type nodeParts struct {
	core Config
	sync registrysync.Config
}

// testNodeParts are the parts of node over st and the API c, with the
// node agent's defaults, whose hostname is its name and whose mount gate
// is under root ("" for none); its registry sync trusts no class until a
// test gives it some. Its informers of pods, PVs and claims are never
// started: a test puts what they would see in their stores.
func testNodeParts(t testing.TB, node, root string, st kit.Store, c client.Client, events events.EventRecorder) nodeParts {
	caches := &kit.Caches{Client: c, Reader: c, Node: node}
	m := testMetrics(t)
	reports, squashes, publishes := kit.NewCacheQueue("report", 1), kit.NewCacheQueue("squash", 1), kit.NewCacheQueue("publish", 1)
	kube := kubefake.NewClientset()
	informers := informers.NewSharedInformerFactory(kube, 0)
	return nodeParts{
		core: Config{
			Node: node, Hostname: node, Root: root, Store: st, Caches: caches, Events: events, Metrics: m,
			Reports: reports, Squashes: squashes, Publishes: publishes,
			GC: layerfs.GCOptions{MinFreePercent: 15}, CSILimits: testCSILimits, ResyncInterval: time.Minute,
			Kube: kube, Pods: informers.Core().V1().Pods().Informer(), PVs: informers.Core().V1().PersistentVolumes().Informer(),
			Claims:  informers.Core().V1().PersistentVolumeClaims().Lister(),
			Classes: informers.Storage().V1().StorageClasses().Lister(),
		},
		sync: registrysync.Config{
			Node: node, Store: st, Caches: caches, Events: events, Metrics: m,
			TmpDir: filepath.Join(t.TempDir(), "tmp"), Compression: remote.DefaultCompression,
			Reports: reports, Squashes: squashes, Publishes: publishes,
		},
	}
}

// build makes the node as the agent does: its registry sync, then its
// core over it.
func (p nodeParts) build(t testing.TB) (*Core, *registrysync.Syncer) {
	t.Helper()
	sync := registrysync.New(p.sync)
	p.core.Sync = sync
	core, err := New(p.core)
	if err != nil {
		t.Fatal(err)
	}
	return core, sync
}

// setStore makes st the store of both parts.
func (p *nodeParts) setStore(st kit.Store) { p.core.Store, p.sync.Store = st, st }

// drainEvents returns the events recorded so far as "Type Reason Message".
func (e *testEnv) drainEvents() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// wantEvent checks that exactly one recorded event starts with prefix
// ("Warning InvalidAnnotation") and contains every substring.
func (e *testEnv) wantEvent(t testing.TB, prefix string, contains ...string) {
	t.Helper()
	events := e.drainEvents()
	var found []string
	for _, ev := range events {
		if strings.HasPrefix(ev, prefix+" ") {
			found = append(found, ev)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one event %q, got events %q", prefix, events)
	}
	for _, c := range contains {
		if !strings.Contains(found[0], c) {
			t.Errorf("event %q does not contain %q", found[0], c)
		}
	}
}

// metricValue reads a counter or gauge.
func metricValue(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	switch {
	case out.Counter != nil:
		return out.Counter.GetValue()
	case out.Gauge != nil:
		return out.Gauge.GetValue()
	}
	t.Fatalf("metric %v is neither counter nor gauge", m.Desc())
	return 0
}

func clientKey(ref layerfs.CacheRef) client.ObjectKey {
	return client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}
}
