package volumes

import (
	"context"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
	"github.com/layercache/layercache/nodeagent/registrysync"
	"github.com/layercache/layercache/remote/registrytest"
)

// The tests in this file run two node agents, each over its own real
// store, against one API (a fake client) and one registry (in-process,
// TLS and basic auth): a cache committed on one node reaches the other.

const registrySecret = "registry-creds"

// syncCluster is two nodes that share an API and a registry.
type syncCluster struct {
	client client.Client
	reg    *registrytest.Registry
	nodes  map[string]*syncNode
	// password is what the Secret holds; a test may break it.
	secret *corev1.Secret
	// classes are the StorageClasses the agents serve; the registry's
	// class "layercache" (params) to begin with.
	classes cache.Indexer
	// request is the claims' storage request, if not provisionOptions'.
	request string
	// kubeletDirs are the nodes' kubelet directories once the cluster
	// serves CSI volumes (serveCSI).
	kubeletDirs map[string]string
	// layout is the registry class's layout parameter, if set.
	layout layerfs.Layout
}

type syncNode struct {
	name    string
	prov    *Provisioner
	maint   *Maintainer
	sync    *registrysync.Syncer
	store   *layerfs.Store
	caches  *kit.Caches
	metrics *kit.Metrics
	events  *events.FakeRecorder
	// csi is the node's CSI driver, with a kubelet directory (csisync_test.go),
	// and pods its informer's pods; nil unless the cluster serves CSI.
	csi  *csiDriver
	pods cache.Indexer
}

func newSyncCluster(t testing.TB) *syncCluster {
	t.Helper()
	reg := registrytest.New(t)
	c := &syncCluster{client: newCacheClient(t), reg: reg, nodes: map[string]*syncNode{},
		classes: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	c.addClass(t, kittest.Class(c.params()))
	c.secret = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: registrySecret, Namespace: "layercache-system"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{
			corev1.DockerConfigJsonKey: reg.DockerConfig(registrytest.User, registrytest.Password),
			registrysync.SecretKeyCA:   reg.CA,
		},
	}
	c.addNode(t, "node-a")
	c.addNode(t, "node-b")
	return c
}

// addNode starts a node agent over a new store.
func (c *syncCluster) addNode(t testing.TB, name string) *syncNode {
	t.Helper()
	n := c.startAgent(t, name, openRealStore(t, 0))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	if err := c.client.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	return n
}

// restart replaces node's agent with a new one over the same store, as
// after a kill: nothing the old one had in memory survives.
func (c *syncCluster) restart(t testing.TB, name string) *syncNode {
	t.Helper()
	return c.startAgent(t, name, c.nodes[name].store)
}

func (c *syncCluster) startAgent(t testing.TB, name string, st *layerfs.Store) *syncNode {
	t.Helper()
	return c.startAgentWith(t, name, st, func(*nodeParts) {})
}

// startAgentWith starts node's agent over st with parts that change
// changed: a store that fails where a test wants it to, say.
func (c *syncCluster) startAgentWith(t testing.TB, name string, st *layerfs.Store, change func(*nodeParts)) *syncNode {
	t.Helper()
	events := events.NewFakeRecorder(100)
	parts := testNodeParts(t, name, st.Root(), st, c.client, events)
	parts.sync.TmpDir = filepath.Join(st.Root(), "tmp")
	parts.sync.Secrets = c.getSecret
	parts.sync.Classes = storagelisters.NewStorageClassLister(c.classes)
	parts.core.Classes = parts.sync.Classes
	change(&parts)
	core, sync := parts.build(t)
	n := &syncNode{name: name, prov: core.prov, maint: core.maint, sync: sync, store: st, caches: parts.core.Caches, metrics: parts.core.Metrics, events: events,
		csi: core.csi, pods: parts.core.Pods.GetIndexer()}
	c.nodes[name] = n
	return n
}

// addClass makes the agents serve class (or its new version).
func (c *syncCluster) addClass(t testing.TB, class *storagev1.StorageClass) {
	t.Helper()
	if err := c.classes.Add(class); err != nil {
		t.Fatal(err)
	}
}

func (c *syncCluster) getSecret(_ context.Context, name string) (*corev1.Secret, error) {
	if name != c.secret.Name {
		return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
	}
	return c.secret, nil
}

func (c *syncCluster) params() map[string]string {
	p := map[string]string{kit.ParamRegistry: c.reg.Host + "/caches", kit.ParamRegistrySecret: registrySecret}
	if c.layout != "" {
		p[kit.ParamLayout] = string(c.layout)
	}
	return p
}

// provision provisions claim name for cache maven on node.
func (c *syncCluster) provision(t testing.TB, node, name string) *corev1.PersistentVolume {
	t.Helper()
	return c.provisionWith(t, node, name, nil)
}

// provisionWith provisions as provision, through a class with the extra
// parameters.
func (c *syncCluster) provisionWith(t testing.TB, node, name string, extra map[string]string) *corev1.PersistentVolume {
	t.Helper()
	params := c.params()
	maps.Copy(params, extra)
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "maven"}, params)
	opts.PVC.Name, opts.PVC.UID = name, types.UID("0c5e7a38-6c2d-4a8e-9a1f-"+name)
	if c.request != "" {
		opts.PVC.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(c.request)
	}
	opts.PVC.Annotations[kit.AnnSelectedNode] = node
	opts.SelectedNodeName = node
	opts.PVName = "pvc-" + string(opts.PVC.UID)
	pv, state, err := c.nodes[node].prov.Provision(context.Background(), opts)
	if err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision %s on %s: %v, %v", name, node, state, err)
	}
	return pv
}

// commit ends the PV's build as succeeded on node and publishes as the
// agent's queue would.
func (c *syncCluster) commit(t testing.TB, node string, pv *corev1.PersistentVolume) error {
	t.Helper()
	c.end(t, node, pv)
	return c.nodes[node].sync.Publish(context.Background(), maven)
}

func (c *syncCluster) published(t testing.TB) *v1alpha1.PublishedChain {
	t.Helper()
	var cache v1alpha1.Cache
	if err := c.client.Get(context.Background(), clientKey(maven), &cache); err != nil {
		t.Fatal(err)
	}
	return cache.Status.Published
}

func wantEvents(t *testing.T, n *syncNode, prefix string, count int, contains ...string) {
	t.Helper()
	var found []string
	all := drain(n)
	for _, ev := range all {
		if strings.HasPrefix(ev, prefix+" ") {
			found = append(found, ev)
		}
	}
	if len(found) != count {
		t.Fatalf("node %s: want %d events %q, got %q", n.name, count, prefix, all)
	}
	for _, ev := range found {
		for _, c := range contains {
			if !strings.Contains(ev, c) {
				t.Errorf("event %q does not contain %q", ev, c)
			}
		}
	}
}

// quietRequests waits until reg has served no request for a second (what
// a store does in the background after a lazy mount: completing the copy,
// storing the layer's prefetch list) and returns its count of requests.
func quietRequests(t *testing.T, reg *registrytest.Registry) int64 {
	t.Helper()
	last := reg.Requests.Load()
	for range 60 {
		time.Sleep(time.Second)
		now := reg.Requests.Load()
		if now == last {
			return now
		}
		last = now
	}
	t.Fatalf("the registry served requests for a minute after the mounts: %d in all", last)
	return 0
}

func TestSyncCommitReachesTheOtherNode(t *testing.T) {
	c := newSyncCluster(t)
	pv := c.provision(t, "node-a", "build-1")
	writeFile(t, pv, "from-a.txt", "built on a")
	if err := c.commit(t, "node-a", pv); err != nil {
		t.Fatalf("publish: %v", err)
	}
	pub := c.published(t)
	if pub == nil || pub.Generation != 1 || len(pub.Layers) != 1 || pub.Layers[0].Node != "node-a" ||
		pub.Repository != c.reg.Host+"/caches/ci/maven" || pub.Secret != registrySecret {
		t.Fatalf("published chain %+v: want generation 1, one layer from node-a in %s/caches/ci/maven", pub, c.reg.Host)
	}

	next := c.provision(t, "node-b", "build-2")
	wantFile(t, next, "from-a.txt", "built on a")
	if got := next.Annotations[v1alpha1.AnnotationBaseGeneration]; got != "1" {
		t.Errorf("node-b's volume base generation %q, want 1", got)
	}
	// A second volume on node-b needs nothing more from the registry.
	// Its first one was mounted first: the copy's completion and, once
	// settled, the store of the layer's prefetch list run in the
	// background; they are done when the registry has been quiet a while.
	before := quietRequests(t, c.reg)
	again := c.provision(t, "node-b", "build-3")
	wantFile(t, again, "from-a.txt", "built on a")
	if n := c.reg.Requests.Load() - before; n != 0 {
		t.Errorf("an up-to-date node made %d registry requests to mount, want 0", n)
	}
}

func TestSyncConcurrentCommitsOnTwoNodesBothLand(t *testing.T) {
	c := newSyncCluster(t)
	onA := c.provision(t, "node-a", "a")
	onB := c.provision(t, "node-b", "b")
	writeFile(t, onA, "a.txt", "a")
	writeFile(t, onB, "b.txt", "b")
	writeFile(t, onA, "both.txt", "a")
	writeFile(t, onB, "both.txt", "b")
	if err := c.commit(t, "node-a", onA); err != nil {
		t.Fatal(err)
	}
	if err := c.commit(t, "node-b", onB); err != nil {
		t.Fatal(err)
	}
	if pub := c.published(t); pub.Generation != 2 || len(pub.Layers) != 2 || pub.Layers[0].Node != "node-b" {
		t.Fatalf("published chain %+v: want node-b's layer stacked on node-a's", pub)
	}
	// node-b took in node-a's layer when it published; node-a takes in
	// node-b's at its next mount. Both see the same view: per file, the
	// later commit wins, as on one node.
	for _, node := range []string{"node-a", "node-b"} {
		pv := c.provision(t, node, "check-"+node)
		wantFile(t, pv, "a.txt", "a")
		wantFile(t, pv, "b.txt", "b")
		wantFile(t, pv, "both.txt", "b")
	}
}

func TestSyncRegistryOutageLosesNothing(t *testing.T) {
	c := newSyncCluster(t)
	a := c.nodes["node-a"]
	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "kept.txt", "through the outage")
	c.reg.SetDown(true)
	for range 3 { // the queue's retries
		if err := c.commit(t, "node-a", pv); err == nil {
			t.Fatal("publish succeeded while the registry was down")
		}
	}
	wantEvents(t, a, "Warning "+kit.ReasonRegistryFailed, 1, "caches/ci/maven", "stay on node node-a")
	info, err := a.store.Inspect(context.Background(), maven)
	if err != nil || info.Generation != 1 || a.sync.Status(maven, info).Unpublished != 1 {
		t.Fatalf("node-a's cache %+v (%v): want the committed layer kept, unpublished", info, err)
	}
	if err := a.maint.Report(context.Background(), maven); err != nil {
		t.Fatal(err)
	}
	if r := replicaOf(t, c.client, maven, "node-a"); r.Status.Unpublished != 1 {
		t.Errorf("node-a's replica %+v: want 1 unpublished layer (the lag shows)", r.Status)
	}
	// A build on node-b during the outage mounts what node-b has, at
	// once: node-a's status says it cannot publish the layer it announced.
	start := time.Now()
	cold := c.provision(t, "node-b", "during-outage")
	wantNoFile(t, cold, "kept.txt")
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("node-b waited %v for a layer node-a cannot publish", took)
	}
	wantEvents(t, c.nodes["node-b"], "Warning "+kit.ReasonSyncIncomplete, 1, "generation 1 from node node-a", "cannot publish now")

	c.reg.SetDown(false)
	if err := a.sync.Publish(context.Background(), maven); err != nil {
		t.Fatalf("publish after the outage: %v", err)
	}
	wantEvents(t, a, "Normal "+kit.ReasonPublished, 1)
	warm := c.provision(t, "node-b", "after-outage")
	wantFile(t, warm, "kept.txt", "through the outage")
}

func TestSyncBadCredentialsNameTheSecretAndRegistry(t *testing.T) {
	c := newSyncCluster(t)
	c.secret.Data[corev1.DockerConfigJsonKey] = c.reg.DockerConfig(registrytest.User, "wrong")
	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "x.txt", "x")
	err := c.commit(t, "node-a", pv)
	if err == nil {
		t.Fatal("publish with a wrong password succeeded")
	}
	wantEvents(t, c.nodes["node-a"], "Warning "+kit.ReasonRegistryFailed, 1,
		`Secret "`+registrySecret+`"`, c.reg.Host+"/caches/ci/maven", "refused the credentials")
	if got := registrysync.FailureReason(err); got != "unauthorized" {
		t.Errorf("failure reason %q, want unauthorized", got)
	}
}
