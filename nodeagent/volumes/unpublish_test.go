package volumes

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/registrysync"
	"github.com/layercache/layercache/remote"
	"github.com/layercache/layercache/remote/registrytest"
)

// The tests in this file delete Caches that two real nodes published to
// the in-process registry, and check what is left in the registry.

// registryTarget reaches repository with the registry's credentials.
func (c *syncCluster) registryTarget(t testing.TB, repository string) *remote.Target {
	t.Helper()
	tg, err := remote.NewTarget(repository, remote.Credentials{
		DockerConfigJSON: c.reg.DockerConfig(registrytest.User, registrytest.Password), CAPEM: c.reg.CA}, remote.Zstd)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// latestStatus is the registry's HTTP status for HEAD of the
// repository's latest.
func (c *syncCluster) latestStatus(t testing.TB, repository string) int {
	t.Helper()
	return c.tagStatus(t, repository, "latest")
}

// tagStatus is the HTTP status of a HEAD of repository:tag.
func (c *syncCluster) tagStatus(t testing.TB, repository, tag string) int {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.reg.CA)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}, Timeout: 10 * time.Second}
	host, path, _ := strings.Cut(repository, "/")
	req, err := http.NewRequest(http.MethodHead, "https://"+host+"/v2/"+path+"/manifests/"+tag, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(registrytest.User, registrytest.Password)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// deleteCache deletes maven, as a user does; FinalizerCleanup (the
// manager's) holds it as it does in a cluster, so that only the test
// decides when the nodes are done.
func (c *syncCluster) deleteCache(t testing.TB) *v1alpha1.Cache {
	t.Helper()
	ctx := context.Background()
	var cache v1alpha1.Cache
	if err := c.client.Get(ctx, clientKey(maven), &cache); err != nil {
		t.Fatal(err)
	}
	controllerutil.AddFinalizer(&cache, v1alpha1.FinalizerCleanup)
	if err := c.client.Update(ctx, &cache); err != nil {
		t.Fatal(err)
	}
	if err := c.client.Delete(ctx, &cache); err != nil {
		t.Fatal(err)
	}
	if err := c.client.Get(ctx, clientKey(maven), &cache); err != nil {
		t.Fatal(err)
	}
	return &cache
}

func (c *syncCluster) reconcileDeletion(node string) error {
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: maven.Namespace, Name: maven.Name}}
	_, err := c.nodes[node].maint.Reconcile(context.Background(), req)
	return err
}

// finalizers are the Cache's finalizers; nil if it is gone.
func (c *syncCluster) finalizers(t testing.TB) []string {
	t.Helper()
	var cache v1alpha1.Cache
	err := c.client.Get(context.Background(), clientKey(maven), &cache)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return cache.Finalizers
}

func hasRegistryFinalizer(fs []string) bool {
	for _, f := range fs {
		if f == v1alpha1.FinalizerRegistry {
			return true
		}
	}
	return false
}

func TestUnpublishPublishingHoldsTheCacheForItsRegistry(t *testing.T) {
	c := newSyncCluster(t)
	c.publishOnce(t, "a.txt")
	if fs := c.finalizers(t); !hasRegistryFinalizer(fs) {
		t.Fatalf("finalizers %q after a publish: want %s", fs, v1alpha1.FinalizerRegistry)
	}

	// A Cache published before agents held it gets the finalizer from
	// the periodic pass of a node that has the cache.
	var cache v1alpha1.Cache
	if err := c.client.Get(context.Background(), clientKey(maven), &cache); err != nil {
		t.Fatal(err)
	}
	controllerutil.RemoveFinalizer(&cache, v1alpha1.FinalizerRegistry)
	if err := c.client.Update(context.Background(), &cache); err != nil {
		t.Fatal(err)
	}
	c.nodes["node-a"].maint.Pass(context.Background())
	if fs := c.finalizers(t); !hasRegistryFinalizer(fs) {
		t.Errorf("finalizers %q after the periodic pass: want %s added to the older Cache", fs, v1alpha1.FinalizerRegistry)
	}
}

func TestUnpublishDeletesTheManifestOnceAcrossNodes(t *testing.T) {
	c := newSyncCluster(t)
	pub := c.publishOnce(t, "a.txt")
	c.provision(t, "node-b", "reader") // node-b holds it too
	if got := c.latestStatus(t, pub.Repository); got != 200 {
		t.Fatalf("latest before the delete: %d, want 200", got)
	}
	// node-b mounted the layer first: once its copy settled, it stored
	// the layer's prefetch list, which the delete takes too.
	quietRequests(t, c.reg)
	prefetch := "prefetch-" + strings.TrimPrefix(pub.Layers[0].Digest, "sha256:")
	if got := c.tagStatus(t, pub.Repository, prefetch); got != 200 {
		t.Fatalf("the layer's prefetch list before the delete: %d, want 200", got)
	}
	cache := c.deleteCache(t)

	// Both agents see the deletion at once; either may win.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, node := range []string{"node-a", "node-b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.nodes[node].sync.Unpublish(context.Background(), cache.DeepCopy())
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("unpublish on node %d: %v", i, err)
		}
	}
	if got := c.latestStatus(t, pub.Repository); got != 404 {
		t.Errorf("latest after the delete: %d, want 404", got)
	}
	if got := c.tagStatus(t, pub.Repository, prefetch); got != 404 {
		t.Errorf("the layer's prefetch list after the delete: %d, want 404", got)
	}
	if n := c.reg.Deletes.Load(); n != 2 {
		t.Errorf("the registry deleted %d manifests, want 2: latest's and the prefetch list's, once each", n)
	}
	var deleted, warnings []string
	for _, node := range []string{"node-a", "node-b"} {
		for _, ev := range drain(c.nodes[node]) {
			switch {
			case strings.HasPrefix(ev, "Normal "+kit.ReasonManifestDeleted+" "):
				deleted = append(deleted, ev)
			case strings.HasPrefix(ev, "Warning "):
				warnings = append(warnings, ev)
			}
		}
	}
	if len(deleted) != 1 || len(warnings) != 0 {
		t.Errorf("events %q and warnings %q: want one %s and no Warning", deleted, warnings, kit.ReasonManifestDeleted)
	}
	if fs := c.finalizers(t); hasRegistryFinalizer(fs) {
		t.Errorf("finalizers %q: want %s lifted", fs, v1alpha1.FinalizerRegistry)
	}

	// The nodes clear it through the same Reconcile; once they have and
	// the manager lifts its finalizer, the Cache is gone.
	for _, node := range []string{"node-a", "node-b"} {
		if err := c.reconcileDeletion(node); err != nil {
			t.Fatal(err)
		}
		if _, err := c.nodes[node].store.Inspect(context.Background(), maven); err == nil {
			t.Errorf("cache still on %s", node)
		}
	}
}

func TestUnpublishRefusedDeleteLetsTheCacheGo(t *testing.T) {
	c := newSyncCluster(t)
	pub := c.publishOnce(t, "a.txt")
	c.reg.SetDeleteRefused(true)
	c.deleteCache(t)
	if err := c.reconcileDeletion("node-a"); err != nil {
		t.Fatalf("a refused delete is not retried, so the Reconcile succeeds: %v", err)
	}
	wantEvents(t, c.nodes["node-a"], "Warning "+kit.ReasonDeleteRefused, 1,
		"storage: delete: enabled: true", "REGISTRY_STORAGE_DELETE_ENABLED=true", "crane delete "+pub.Repository+"@sha256:")
	if fs := c.finalizers(t); hasRegistryFinalizer(fs) {
		t.Errorf("finalizers %q: the Cache goes though the registry refused", fs)
	}
	if got := c.latestStatus(t, pub.Repository); got != 200 {
		t.Errorf("latest after a refused delete: %d, want 200 (still there)", got)
	}
}

func TestUnpublishOutageRetriesOnceReportedThenGivesUp(t *testing.T) {
	c := newSyncCluster(t)
	pub := c.publishOnce(t, "a.txt")
	c.reg.SetDown(true)
	c.deleteCache(t)
	for range 2 {
		if err := c.reconcileDeletion("node-a"); err == nil {
			t.Fatal("Reconcile succeeded while the registry was down; want an error, retried with backoff")
		}
	}
	wantEvents(t, c.nodes["node-a"], "Warning "+kit.ReasonDeleteFailed, 1, pub.Repository, "retried with backoff until")
	if fs := c.finalizers(t); !hasRegistryFinalizer(fs) {
		t.Fatalf("finalizers %q during the outage: want %s kept", fs, v1alpha1.FinalizerRegistry)
	}

	c.startAgentWith(t, "node-a", c.nodes["node-a"].store, func(p *nodeParts) { p.sync.UnpublishGiveUp = time.Nanosecond })
	if err := c.reconcileDeletion("node-a"); err != nil {
		t.Fatalf("Reconcile past the give-up time: %v", err)
	}
	wantEvents(t, c.nodes["node-a"], "Warning "+kit.ReasonDeleteFailed, 1, "gave up", "crane delete "+pub.Repository)
	if fs := c.finalizers(t); hasRegistryFinalizer(fs) {
		t.Errorf("finalizers %q after giving up: want %s lifted", fs, v1alpha1.FinalizerRegistry)
	}
}

func TestUnpublishOutageThatEndsDeletes(t *testing.T) {
	c := newSyncCluster(t)
	pub := c.publishOnce(t, "a.txt")
	c.reg.SetDown(true)
	c.deleteCache(t)
	if err := c.reconcileDeletion("node-a"); err == nil {
		t.Fatal("Reconcile succeeded while the registry was down")
	}
	c.reg.SetDown(false)
	if err := c.reconcileDeletion("node-a"); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, c.nodes["node-a"], "Normal "+kit.ReasonManifestDeleted, 1, pub.Repository)
	if got := c.latestStatus(t, pub.Repository); got != 404 {
		t.Errorf("latest: %d, want 404", got)
	}
}

// A status.published forged to name another cache's repository makes
// no agent delete anything there.
func TestUnpublishAForgedChainDeletesNothing(t *testing.T) {
	c := newSyncCluster(t)
	pub := c.publishOnce(t, "a.txt")
	victim := c.reg.Host + "/caches/prod/release"
	tg := c.registryTarget(t, victim)
	blob, err := tg.PushLayer(context.Background(), t.TempDir(), func(w io.Writer) error { _, err := io.WriteString(w, "prod's release"); return err })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tg.PushManifest(context.Background(), []remote.Blob{blob}); err != nil {
		t.Fatal(err)
	}
	forged := pub.DeepCopy()
	forged.Repository = victim
	c.setPublished(t, forged)
	c.deleteCache(t)
	if err := c.reconcileDeletion("node-a"); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, c.nodes["node-a"], "Warning "+kit.ReasonUntrustedChain, 1, "deleted nothing", victim)
	if got := c.latestStatus(t, victim); got != 200 {
		t.Errorf("the victim's latest: %d, want 200", got)
	}
	if n := c.reg.Deletes.Load(); n != 0 {
		t.Errorf("the registry deleted %d manifests, want 0", n)
	}
	if fs := c.finalizers(t); hasRegistryFinalizer(fs) {
		t.Errorf("finalizers %q: the Cache goes", fs)
	}
}

// A manifest pushed after the deletion began is deleted by its pusher:
// the agent that deleted the registry copy may have come first.
func TestUnpublishAManifestPushedDuringTheDeletionIsDeleted(t *testing.T) {
	c := newSyncCluster(t)
	pub := c.publishOnce(t, "a.txt")
	s := c.nodes["node-a"].sync
	tg := c.registryTarget(t, pub.Repository)

	digest, err := tg.PushManifest(context.Background(), registrysync.BlobsBaseFirst(pub))
	if err != nil {
		t.Fatal(err)
	}
	s.UnpushIfDeleting(context.Background(), maven, tg, digest)
	if got := c.latestStatus(t, pub.Repository); got != 200 {
		t.Fatalf("latest of a live Cache after unpushIfDeleting: %d, want 200 (kept)", got)
	}

	// The other agent deleted the copy and lifted the finalizer before
	// this push landed.
	c.deleteCache(t)
	if err := c.nodes["node-a"].caches.ReleaseRegistry(context.Background(), maven); err != nil {
		t.Fatal(err)
	}
	digest, err = tg.PushManifest(context.Background(), registrysync.BlobsBaseFirst(pub))
	if err != nil {
		t.Fatal(err)
	}
	s.UnpushIfDeleting(context.Background(), maven, tg, digest)
	if got := c.latestStatus(t, pub.Repository); got != 404 {
		t.Errorf("latest pushed during the deletion: %d, want 404", got)
	}
}
