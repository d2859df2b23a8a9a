package volumes

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

// The tests in this file pin the trust model of the published chain: the
// owner decides where its cache goes, and every agent checks each chain
// it reads against the classes it serves before a byte moves.

// namedClass is a registry class of another name than testClass's.
func namedClass(name string, params map[string]string) *storagev1.StorageClass {
	c := kittest.Class(params)
	c.Name = name
	return c
}

// claimOn provisions claim name of namespace ns for cache (the
// annotation's value) on node through class.
func (c *syncCluster) claimOn(t *testing.T, node, ns, name, cache string, class *storagev1.StorageClass, storage string) (*corev1.PersistentVolume, error) {
	t.Helper()
	opts := provisionOptions(ns, map[string]string{v1alpha1.AnnotationCache: cache}, nil)
	opts.StorageClass = class
	opts.PVC.Name, opts.PVC.UID = name, types.UID("7d1e2f3a-4b5c-4d6e-8f70-"+ns+"-"+name)
	opts.PVC.Annotations[kit.AnnSelectedNode] = node
	opts.PVC.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(storage)}
	opts.SelectedNodeName = node
	opts.PVName = "pvc-" + string(opts.PVC.UID)
	pv, state, err := c.nodes[node].prov.Provision(context.Background(), opts)
	if err == nil && state != controller.ProvisioningFinished {
		t.Fatalf("Provision %s/%s on %s: state %v", ns, name, node, state)
	}
	return pv, err
}

// setPublished writes the Cache's chain as whoever may write
// caches/status would.
func (c *syncCluster) setPublished(t *testing.T, pub *v1alpha1.PublishedChain) {
	t.Helper()
	var cache v1alpha1.Cache
	if err := c.client.Get(context.Background(), clientKey(maven), &cache); err != nil {
		t.Fatal(err)
	}
	cache.Status.Published = pub
	if err := c.client.Status().Update(context.Background(), &cache); err != nil {
		t.Fatal(err)
	}
}

func (c *syncCluster) setReaders(t *testing.T, readers ...string) {
	t.Helper()
	var cache v1alpha1.Cache
	if err := c.client.Get(context.Background(), clientKey(maven), &cache); err != nil {
		t.Fatal(err)
	}
	cache.Spec.Readers = readers
	if err := c.client.Update(context.Background(), &cache); err != nil {
		t.Fatal(err)
	}
}

// publishOnce commits a volume with file on node-a and returns the chain.
func (c *syncCluster) publishOnce(t *testing.T, file string) *v1alpha1.PublishedChain {
	t.Helper()
	pv := c.provision(t, "node-a", "build-"+strings.TrimSuffix(file, ".txt"))
	writeFile(t, pv, file, "from a")
	if err := c.commit(t, "node-a", pv); err != nil {
		t.Fatalf("publish: %v", err)
	}
	return c.published(t)
}

func failures(t *testing.T, n *syncNode, op, reason string) float64 {
	t.Helper()
	return metricValue(t, n.prov.metrics.Failures.WithLabelValues(op, reason))
}

func TestTrustAReaderCannotRedirectTheOwnersPublishing(t *testing.T) {
	c := newSyncCluster(t)
	ownerRepo := c.reg.Host + "/caches/ci/maven"
	readerClass := namedClass("reader-registry", map[string]string{kit.ParamRegistry: c.reg.Host + "/other", kit.ParamRegistrySecret: registrySecret})
	c.addClass(t, readerClass)
	if err := c.client.Create(context.Background(), cacheObject("ci", "maven", "pr")); err != nil {
		t.Fatal(err)
	}

	// Before the owner published anything, the reader mounts what its
	// node has and records nothing.
	if _, err := c.claimOn(t, "node-b", "pr", "early", "ci/maven", readerClass, "1Gi"); err != nil {
		t.Fatalf("granted reader refused: %v", err)
	}
	if pub := c.published(t); pub != nil {
		t.Fatalf("a reader's claim recorded chain %+v on the owner's Cache; want none", pub)
	}

	pub := c.publishOnce(t, "one.txt")
	if pub.Repository != ownerRepo || pub.Generation != 1 {
		t.Fatalf("chain %+v: want the owner's class's repository %s at generation 1", pub, ownerRepo)
	}
	read, err := c.claimOn(t, "node-b", "pr", "granted", "ci/maven", readerClass, "1Gi")
	if err != nil {
		t.Fatal(err)
	}
	wantFile(t, read, "one.txt", "from a")
	if got := c.published(t); got.Repository != ownerRepo || got.Secret != registrySecret {
		t.Errorf("after the reader's pull the chain names %s (Secret %q); want the owner's %s", got.Repository, got.Secret, ownerRepo)
	}

	// Revoked: every new claim is refused, and the owner's commits still
	// go to the owner's repository.
	c.setReaders(t)
	if _, err := c.claimOn(t, "node-b", "pr", "revoked", "ci/maven", readerClass, "1Gi"); err == nil || !strings.Contains(err.Error(), "does not grant namespace \"pr\"") {
		t.Fatalf("a revoked reader's claim: %v; want it refused", err)
	}
	if pub := c.publishOnce(t, "two.txt"); pub.Repository != ownerRepo || pub.Generation != 2 {
		t.Fatalf("chain %+v after the revocation: want the owner's repository at generation 2", pub)
	}
	c.addNode(t, "node-c")
	onC := c.provision(t, "node-c", "fresh")
	wantFile(t, onC, "one.txt", "from a")
	wantFile(t, onC, "two.txt", "from a")
}

func TestTrustTheOwnerReplacesAnEmptyChainItDidNotChoose(t *testing.T) {
	// A chain without layers that a reader's class placed before readers
	// were kept from it: nothing lives there, so the owner's next writing
	// claim puts the owner's registry in its place.
	c := newSyncCluster(t)
	if err := c.client.Create(context.Background(), cacheObject("ci", "maven", "pr")); err != nil {
		t.Fatal(err)
	}
	c.setPublished(t, &v1alpha1.PublishedChain{Repository: c.reg.Host + "/other/ci/maven", Secret: registrySecret})
	if pub := c.publishOnce(t, "x.txt"); pub.Repository != c.reg.Host+"/caches/ci/maven" || pub.Generation != 1 {
		t.Errorf("chain %+v: want the owner's repository at generation 1", pub)
	}
}

func TestTrustAChainOfAnotherRepositoryOrSecretIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(c *syncCluster, pub *v1alpha1.PublishedChain)
		want   []string
	}{
		{"another namespace's repository", func(c *syncCluster, pub *v1alpha1.PublishedChain) {
			pub.Repository = c.reg.Host + "/caches/victim/maven"
		}, []string{"status.published.repository", "/caches/victim/maven", "/caches/ci/maven"}},
		{"a prefix no class has", func(c *syncCluster, pub *v1alpha1.PublishedChain) {
			pub.Repository = c.reg.Host + "/elsewhere/ci/maven"
		}, []string{"status.published.repository", "/elsewhere/ci/maven", "/caches/ci/maven"}},
		{"a Secret no class pairs with the prefix", func(c *syncCluster, pub *v1alpha1.PublishedChain) {
			pub.Secret = "admin-creds"
		}, []string{"status.published.secret", `"admin-creds"`, `"` + registrySecret + `"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newSyncCluster(t)
			pub := c.publishOnce(t, "x.txt")
			tc.change(c, pub)
			c.setPublished(t, pub)
			before := c.reg.Requests.Load()

			b := c.nodes["node-b"]
			cold := c.provision(t, "node-b", "reader")
			wantNoFile(t, cold, "x.txt")
			wantEvents(t, b, "Warning "+kit.ReasonUntrustedChain, 2, tc.want...) // on the claim and on the Cache
			if got := failures(t, b, kit.OpPull, kit.FailureUntrusted); got != 1 {
				t.Errorf("pull failures{reason=%s} = %v, want 1", kit.FailureUntrusted, got)
			}

			a := c.nodes["node-a"]
			pv := c.provision(t, "node-a", "writer")
			writeFile(t, pv, "y.txt", "y")
			if err := c.commit(t, "node-a", pv); err == nil {
				t.Fatal("node-a published to a chain it does not trust")
			}
			// Its own claim's pull, on the claim and the Cache, and the push.
			wantEvents(t, a, "Warning "+kit.ReasonUntrustedChain, 3, tc.want...)
			if got := failures(t, a, kit.OpPush, kit.FailureUntrusted); got != 1 {
				t.Errorf("push failures{reason=%s} = %v, want 1", kit.FailureUntrusted, got)
			}
			if n := c.reg.Requests.Load() - before; n != 0 {
				t.Errorf("the registry got %d requests for an untrusted chain, want 0", n)
			}
			if got := c.published(t); got.Generation != pub.Generation {
				t.Errorf("chain %+v: want it left as it was", got)
			}
		})
	}
}

func TestTrustAGenerationJumpIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(pub *v1alpha1.PublishedChain)
		want   []string
	}{
		{"a plain layer that claims many commits", func(pub *v1alpha1.PublishedChain) {
			pub.Generation, pub.Layers[0].Generation = 1<<40, 1<<40
		}, []string{"status.published.layers[0].generation", "1099511627776", "a layer that is not a squash is one commit"}},
		{"a squash past what time allows", func(pub *v1alpha1.PublishedChain) {
			pub.Generation, pub.Layers[0].Generation = 1<<40, 1<<40
			pub.Layers[0].Covers = []string{"sha256:" + strings.Repeat("a", 64), "sha256:" + strings.Repeat("b", 64)}
		}, []string{"status.published.generation", "1099511627776", "this node is at generation 0"}},
		{"a generation that is not the newest layer's", func(pub *v1alpha1.PublishedChain) {
			pub.Generation = 1 << 62
		}, []string{"status.published.generation", "4611686018427387904", "the newest layer's generation, 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newSyncCluster(t)
			pub := c.publishOnce(t, "x.txt")
			tc.change(pub)
			c.setPublished(t, pub)
			before := c.reg.Requests.Load()
			b := c.nodes["node-b"]
			cold := c.provision(t, "node-b", "reader")
			wantNoFile(t, cold, "x.txt")
			wantEvents(t, b, "Warning "+kit.ReasonUntrustedChain, 2, tc.want...)
			if n := c.reg.Requests.Load() - before; n != 0 {
				t.Errorf("the registry got %d requests for a refused chain, want 0", n)
			}
			info, err := b.store.Inspect(context.Background(), maven)
			if err != nil || info.Generation != 0 {
				t.Errorf("node-b's cache %+v (%v): want it untouched at generation 0", info, err)
			}
		})
	}
}

func TestMaxLayerBound(t *testing.T) {
	withBound := func(v string) *kit.RegistryParams {
		p, err := kit.ParseRegistry(namedClass("big", map[string]string{kit.ParamRegistry: "reg.example/c", kit.ParamMaxLayerSize: v}))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain, err := kit.ParseRegistry(kittest.Class(map[string]string{kit.ParamRegistry: "reg.example/c"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		params   *kit.RegistryParams
		request  int64
		want     int64
		wantFrom string
	}{
		{"the class's", withBound("20Gi"), 1 << 30, 20 << 30, `parameter maxLayerSize of StorageClass "big"`},
		{"the class lifts it", withBound("0"), 1 << 30, 0, `parameter maxLayerSize of StorageClass "big"`},
		{"the claim's request", plain, 1 << 30, 1 << 30, "the claim's storage request"},
		{"no request, no bound", plain, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.params.ForCache(maven, tc.request)
			if got.MaxLayerBytes != tc.want || got.BoundFrom != tc.wantFrom {
				t.Errorf("bound %d from %q, want %d from %q", got.MaxLayerBytes, got.BoundFrom, tc.want, tc.wantFrom)
			}
		})
	}
}

func TestPullOfATooLargeLayerMountsWhatTheNodeHas(t *testing.T) {
	for _, tc := range []struct {
		name    string
		params  map[string]string
		storage string
		want    []string
	}{
		{"the class's bound", map[string]string{kit.ParamMaxLayerSize: "4Ki"}, "1Gi",
			[]string{"cache ci/maven", "4.0KiB", `raise parameter maxLayerSize of StorageClass "small"`}},
		{"the claim's request", nil, "4Ki",
			[]string{"cache ci/maven", "4.0KiB", "the claim's storage request", "raise the claim's storage request"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newSyncCluster(t)
			pv := c.provision(t, "node-a", "build")
			big := make([]byte, 256<<10) // random: it stays large compressed
			rand.Read(big)
			if err := os.WriteFile(filepath.Join(pv.Spec.HostPath.Path, "big"), big, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := c.commit(t, "node-a", pv); err != nil {
				t.Fatal(err)
			}
			params := c.params()
			for k, v := range tc.params {
				params[k] = v
			}
			small := namedClass("small", params)
			c.addClass(t, small)
			b := c.nodes["node-b"]
			cold, err := c.claimOn(t, "node-b", "ci", "small", "maven", small, tc.storage)
			if err != nil {
				t.Fatal(err)
			}
			wantNoFile(t, cold, "big")
			want := append([]string{c.published(t).Layers[0].Digest}, tc.want...)
			wantEvents(t, b, "Warning "+kit.ReasonLayerTooLarge, 1, want...)
			if got := failures(t, b, kit.OpPull, kit.FailureTooLarge); got != 1 {
				t.Errorf("pull failures{reason=%s} = %v, want 1", kit.FailureTooLarge, got)
			}
		})
	}
}

// unpublishableStore fails the export of layers that hold a socket, as
// an exporter that cannot carry one does.
type unpublishableStore struct {
	*layerfs.Store
	exports atomic.Int32
	sockets map[string]bool // layer ids
}

func (s *unpublishableStore) ExportLayer(ctx context.Context, ref layerfs.CacheRef, id string, w io.Writer) error {
	s.exports.Add(1)
	if s.sockets[id] {
		return fmt.Errorf("export layer %s: .gnupg/S.gpg-agent is a socket, which a layer image cannot hold: %w", id, layerfs.ErrUnpublishable)
	}
	return s.Store.ExportLayer(ctx, ref, id, w)
}

func TestAnUnpublishableLayerIsReportedTruthfullyAndNotRetried(t *testing.T) {
	c := newSyncCluster(t)
	ctx := context.Background()
	a := c.nodes["node-a"]
	st := &unpublishableStore{Store: a.store, sockets: map[string]bool{}}
	a = c.startAgentWith(t, "node-a", a.store, func(p *nodeParts) { p.setStore(st) })
	commit := func(name string) string {
		t.Helper()
		pv := c.provision(t, "node-a", name)
		writeFile(t, pv, name, name)
		pv.Annotations[v1alpha1.AnnotationPodOutcome] = v1alpha1.OutcomeSucceeded
		pv.Status.Phase = corev1.VolumeReleased
		if err := a.prov.Delete(ctx, pv); err != nil {
			t.Fatal(err)
		}
		info, err := a.store.Inspect(ctx, maven)
		if err != nil {
			t.Fatal(err)
		}
		return info.Layers[0].ID
	}

	stuck := commit("with-socket")
	st.sockets[stuck] = true
	before := c.reg.Requests.Load()
	if err := a.sync.Publish(ctx, maven); err != nil {
		t.Fatalf("publish of an unpublishable layer returned %v; want nil, as retrying cannot help", err)
	}
	wantEvents(t, a, "Warning "+kit.ReasonLayerUnpublishable, 1,
		"layer "+stuck+" of cache ci/maven cannot be published because", "S.gpg-agent is a socket", "stays on node node-a", "Retrying will not help")
	if n := c.reg.Requests.Load() - before; n != 0 {
		t.Errorf("the registry got %d requests, want 0", n)
	}
	if got := failures(t, a, kit.OpPush, kit.FailureUnpublishable); got != 1 {
		t.Errorf("push failures{reason=%s} = %v, want 1", kit.FailureUnpublishable, got)
	}
	entry := reportedEntry(t, c, a)
	if entry.Unpublished != 1 || !strings.Contains(entry.PublishError, "S.gpg-agent is a socket") {
		t.Errorf("replica status %+v: want 1 unpublished layer and the publish error", entry)
	}

	// The periodic pass does not export it again while nothing changed.
	exports := st.exports.Load()
	if err := a.sync.Publish(ctx, maven); err != nil {
		t.Fatal(err)
	}
	if st.exports.Load() != exports {
		t.Errorf("a publish with nothing changed exported again")
	}
	wantEvents(t, a, "Warning "+kit.ReasonLayerUnpublishable, 0)

	// A later commit makes a new attempt, which the old layer still
	// holds back, in order.
	commit("later")
	if err := a.sync.Publish(ctx, maven); err != nil {
		t.Fatal(err)
	}
	if st.exports.Load() == exports {
		t.Errorf("a publish after a commit did not try again")
	}
	wantEvents(t, a, "Warning "+kit.ReasonLayerUnpublishable, 1, "with the 1 layers committed after it")
	if pub := c.published(t); len(pub.Layers) != 0 {
		t.Errorf("chain %+v: want nothing published past the held-back layer", pub)
	}

	// A squash merges them into a new layer, which publishes.
	if res, err := a.store.Squash(ctx, maven, 1); err != nil || !res.Squashed {
		t.Fatalf("squash: %+v, %v", res, err)
	}
	if err := a.sync.Publish(ctx, maven); err != nil {
		t.Fatalf("publish after the squash: %v", err)
	}
	wantEvents(t, a, "Normal "+kit.ReasonPublished, 1)
	if entry := reportedEntry(t, c, a); entry.Unpublished != 0 || entry.PublishError != "" {
		t.Errorf("replica status %+v after the publish: want nothing unpublished and no error", entry)
	}
}

// reportedEntry reports node n's view of maven and returns its replica's
// status.
func reportedEntry(t *testing.T, c *syncCluster, n *syncNode) v1alpha1.CacheReplicaStatus {
	t.Helper()
	if err := n.maint.Report(context.Background(), maven); err != nil {
		t.Fatal(err)
	}
	return replicaOf(t, c.client, maven, n.name).Status
}
