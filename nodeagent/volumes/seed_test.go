package volumes

import (
	"context"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

var (
	ciMain = layerfs.CacheRef{Namespace: "ci", Name: "main"}
	ciPR1  = layerfs.CacheRef{Namespace: "ci", Name: "pr-1"}
)

// provisionCache provisions claim name of cache (of namespace ci) with
// the annotations ann on node, through the registry class.
func (c *syncCluster) provisionCache(t testing.TB, node, name, cache string, ann map[string]string) *corev1.PersistentVolume {
	t.Helper()
	all := map[string]string{v1alpha1.AnnotationCache: cache}
	for k, v := range ann {
		all[k] = v
	}
	opts := provisionOptions("ci", all, c.params())
	opts.PVC.Name, opts.PVC.UID = name, types.UID("0c5e7a38-6c2d-4a8e-9a1f-"+name)
	opts.PVC.Annotations[kit.AnnSelectedNode] = node
	opts.SelectedNodeName = node
	opts.PVName = "pvc-" + string(opts.PVC.UID)
	pv, state, err := c.nodes[node].prov.Provision(context.Background(), opts)
	if err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision %s on %s: %v, %v", name, node, state, err)
	}
	return pv
}

// build writes files into a new volume of cache on node, commits it and
// publishes the cache.
func (c *syncCluster) build(t testing.TB, node, name string, ref layerfs.CacheRef, ann map[string]string, files ...string) *corev1.PersistentVolume {
	t.Helper()
	pv := c.provisionCache(t, node, name, ref.Name, ann)
	for _, f := range files {
		writeFile(t, pv, f, f+" from "+name)
	}
	c.end(t, node, pv)
	if err := c.nodes[node].sync.Publish(context.Background(), ref); err != nil {
		t.Fatalf("publish %s from %s: %v", ref, node, err)
	}
	return pv
}

func (c *syncCluster) chainOf(t testing.TB, ref layerfs.CacheRef) *v1alpha1.PublishedChain {
	t.Helper()
	var cache v1alpha1.Cache
	if err := c.client.Get(context.Background(), clientKey(ref), &cache); err != nil {
		t.Fatal(err)
	}
	return cache.Status.Published
}

func digests(pub *v1alpha1.PublishedChain) []string {
	var out []string
	for _, l := range pub.Layers {
		out = append(out, l.Digest)
	}
	return out
}

// TestSeedAcrossNodes: main is built on node-a; pr-1's first build, on
// node-b, starts from main (pulled as a read of it would be), and its
// first publish mounts main's blobs into pr-1's repository (or copies
// them, where the registry will not mount) rather than uploading them.
func TestSeedAcrossNodes(t *testing.T) {
	for _, tc := range []struct {
		name          string
		refuseMounts  bool
		wantDirection string
		wantStatus    int // of the mount POSTs
	}{
		{name: "mounted", wantDirection: "mount", wantStatus: 201},
		{name: "mount refused then copied", refuseMounts: true, wantDirection: "copy", wantStatus: 202},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newSyncCluster(t)
			c.reg.SetRefuseMounts(tc.refuseMounts)
			c.build(t, "node-a", "main-1", ciMain, nil, "main.txt")
			c.build(t, "node-a", "main-2", ciMain, nil, "main2.txt")
			mainChain := digests(c.chainOf(t, ciMain))

			fallback := map[string]string{v1alpha1.AnnotationFallback: "main"}
			pr := c.provisionCache(t, "node-b", "pr-a", "pr-1", fallback)
			if got := pr.Annotations[v1alpha1.AnnotationSeededFrom]; got != "ci/main@2" {
				t.Errorf("PV annotation %s = %q, want ci/main@2", v1alpha1.AnnotationSeededFrom, got)
			}
			wantFile(t, pr, "main.txt", "main.txt from main-1")
			wantFile(t, pr, "main2.txt", "main2.txt from main-2")
			writeFile(t, pr, "pr.txt", "pr")
			before := len(c.reg.Log())
			rec := &chainRecorder{Client: c.client, ref: ciPR1}
			c.nodes["node-b"].caches.Client = rec
			c.end(t, "node-b", pr)
			if err := c.nodes["node-b"].sync.Publish(context.Background(), ciPR1); err != nil {
				t.Fatalf("publish pr-1: %v", err)
			}

			// pr-1's chain: its own layer on exactly main's, in its own
			// repository, in one append: no chain ever held part of it.
			if !slices.Contains(rec.lengths, 3) || slices.ContainsFunc(rec.lengths, func(n int) bool { return n == 1 || n == 2 }) {
				t.Errorf("pr-1's chain held part of the seed at some point: its lengths were %v, want 0 then 3", rec.lengths)
			}
			pub := c.chainOf(t, ciPR1)
			if pub.Repository != c.reg.Host+"/caches/ci/pr-1" || pub.Generation != 3 || len(pub.Layers) != 3 ||
				!slices.Equal(digests(pub)[1:], mainChain) || slices.Contains(mainChain, pub.Layers[0].Digest) {
				t.Fatalf("pr-1's chain %+v (digests %v): want its own layer on main's %v in %s/caches/ci/pr-1", pub, digests(pub), mainChain, c.reg.Host)
			}
			log := c.reg.Log()[before:]
			for _, d := range mainChain {
				mount := "POST /v2/caches/ci/pr-1/blobs/uploads/?" + url.Values{"from": {"caches/ci/main"}, "mount": {d}}.Encode()
				if !slices.ContainsFunc(log, func(l string) bool { return l == mount+" "+strconv.Itoa(tc.wantStatus) }) {
					t.Errorf("no %q answered %d in the registry log:\n%s", mount, tc.wantStatus, strings.Join(log, "\n"))
				}
				if slices.ContainsFunc(log, func(l string) bool { return strings.HasPrefix(l, "PUT ") && strings.Contains(l, url.QueryEscape(d)) }) {
					t.Errorf("main's blob %s was uploaded again:\n%s", d, strings.Join(log, "\n"))
				}
			}
			m := c.nodes["node-b"].prov.metrics
			if got := metricValue(t, m.RegistryLayers.WithLabelValues(tc.wantDirection)); got != 2 {
				t.Errorf("registry layers %s = %v, want 2 (main's)", tc.wantDirection, got)
			}
			if got := metricValue(t, m.RegistryLayers.WithLabelValues("push")); got != 1 {
				t.Errorf("registry layers push = %v, want 1 (pr-1's own)", got)
			}
			// node-b's pr-1 is all published now: nothing left to push.
			info, err := c.nodes["node-b"].store.Inspect(context.Background(), ciPR1)
			if err != nil || c.nodes["node-b"].sync.Status(ciPR1, info).Unpublished != 0 {
				t.Errorf("pr-1 on node-b: %+v, %v; want every layer published", info, err)
			}

			// The next build of pr-1, on node-a, sees both and is no seed.
			next := c.provisionCache(t, "node-a", "pr-b", "pr-1", fallback)
			if got, ok := next.Annotations[v1alpha1.AnnotationSeededFrom]; ok {
				t.Errorf("pr-1's second build was seeded from %s", got)
			}
			wantFile(t, next, "main.txt", "main.txt from main-1")
			wantFile(t, next, "pr.txt", "pr")
			if err := c.nodes["node-b"].sync.Publish(context.Background(), ciMain); err != nil {
				t.Fatal(err)
			}
			if got := digests(c.chainOf(t, ciMain)); !slices.Equal(got, mainChain) {
				t.Errorf("main's chain changed: %v, was %v", got, mainChain)
			}
		})
	}
}

// TestSeedOnlyWhileTheCacheHasNoGenerationAnywhere: a cache published
// from another node never starts from a fallback, even when its pull
// fails and the fallback is on this node.
func TestSeedOnlyWhileTheCacheHasNoGenerationAnywhere(t *testing.T) {
	c := newSyncCluster(t)
	c.build(t, "node-b", "main-1", ciMain, nil, "main.txt")
	c.build(t, "node-a", "pr-1", ciPR1, nil, "pr.txt")

	c.reg.SetDown(true)
	pv := c.provisionCache(t, "node-b", "pr-b", "pr-1", map[string]string{v1alpha1.AnnotationFallback: "main"})
	if got, ok := pv.Annotations[v1alpha1.AnnotationSeededFrom]; ok {
		t.Errorf("pr-1, published from node-a, was seeded from %s on node-b", got)
	}
	wantNoFile(t, pv, "main.txt")
}

// chainRecorder records the chain lengths of ref's status patches.
type chainRecorder struct {
	client.Client
	ref     layerfs.CacheRef
	mu      sync.Mutex
	lengths []int
}

func (c *chainRecorder) Status() client.SubResourceWriter {
	return chainRecorderStatus{SubResourceWriter: c.Client.Status(), rec: c}
}

type chainRecorderStatus struct {
	client.SubResourceWriter
	rec *chainRecorder
}

func (s chainRecorderStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	err := s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	if cache, ok := obj.(*v1alpha1.Cache); ok && err == nil && cache.Name == s.rec.ref.Name && cache.Status.Published != nil {
		s.rec.mu.Lock()
		s.rec.lengths = append(s.rec.lengths, len(cache.Status.Published.Layers))
		s.rec.mu.Unlock()
	}
	return err
}

// TestSeededPublishChecksTheFallbacksChain: a seeded layer's blob is
// mounted only from a fallback chain that still passes the trust rules
// and the reader grant; otherwise the layers are exported and pushed, as
// any layer.
func TestSeededPublishChecksTheFallbacksChain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(c *syncCluster, pub *v1alpha1.PublishedChain)
	}{
		{name: "untrusted secret", change: func(_ *syncCluster, pub *v1alpha1.PublishedChain) { pub.Secret = "admin-creds" }},
		{name: "another cache's repository", change: func(c *syncCluster, pub *v1alpha1.PublishedChain) {
			pub.Repository = c.reg.Host + "/caches/victim/main"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newSyncCluster(t)
			c.build(t, "node-a", "main-1", ciMain, nil, "main.txt")
			mainChain := digests(c.chainOf(t, ciMain))
			pr := c.provisionCache(t, "node-b", "pr-a", "pr-1", map[string]string{v1alpha1.AnnotationFallback: "main"})
			wantFile(t, pr, "main.txt", "main.txt from main-1")
			writeFile(t, pr, "pr.txt", "pr")
			c.end(t, "node-b", pr)

			// main's chain is tampered with before pr-1 publishes.
			if _, err := c.nodes["node-a"].prov.caches.UpdatePublished(context.Background(), ciMain, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
				tc.change(c, pub)
				return pub, true
			}); err != nil {
				t.Fatal(err)
			}
			before := len(c.reg.Log())
			if err := c.nodes["node-b"].sync.Publish(context.Background(), ciPR1); err != nil {
				t.Fatalf("publish pr-1: %v", err)
			}
			if log := c.reg.Log()[before:]; slices.ContainsFunc(log, func(l string) bool { return strings.Contains(l, "mount=") }) {
				t.Errorf("pr-1 mounted from a chain that fails the trust rules:\n%s", strings.Join(log, "\n"))
			}
			m := c.nodes["node-b"].prov.metrics
			if got := metricValue(t, m.RegistryLayers.WithLabelValues("push")); got != 2 {
				t.Errorf("registry layers push = %v, want 2 (main's, exported, and pr-1's)", got)
			}
			// Exports are deterministic: the digest is main's all the same.
			if pub := c.chainOf(t, ciPR1); len(pub.Layers) != 2 || pub.Layers[1].Digest != mainChain[0] {
				t.Errorf("pr-1's chain %v, want its layer on main's %v", digests(pub), mainChain)
			}
		})
	}
}
