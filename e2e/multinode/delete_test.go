//go:build e2e && multinode

package multinode

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
)

// deleteTimeout bounds a deleted Cache's way out: both agents clear it
// and one deletes its manifest, each at the next event.
const deleteTimeout = 2 * time.Minute

// TestDeleteACacheDeletesItsRegistryCopy: a Cache built on node A and
// read on node B is deleted. It is gone once both agents cleared it, its
// manifest is gone from the registry (latest answers 404), an agent
// recorded RegistryManifestDeleted, and the registry's garbage collection
// would now free every layer blob of its chain and none of a live
// Cache's.
func TestDeleteACacheDeletesItsRegistryCopy(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)

	e.run(ctx, e.buildPod("build-gone", a, "gone", "", "head -c 300000 /dev/urandom > /cache/gone.bin"))
	e.run(ctx, e.buildPod("build-kept", a, "kept", "", "head -c 300000 /dev/urandom > /cache/kept.bin"))
	gone := e.waitPublished(ctx, "gone", 1).Status.Published
	kept := e.waitPublished(ctx, "kept", 1).Status.Published
	e.run(ctx, e.buildPod("read-gone", b, "gone", "", "test -s /cache/gone.bin"))
	c := e.waitCache(ctx, "gone", time.Minute, "both nodes holding it", func(c *v1alpha1.Cache) bool {
		return e.nodeEntry(c, a) != nil && e.nodeEntry(c, b) != nil && e.nodeEntry(c, b).Generation >= 1
	})
	if !slices.Contains(c.Finalizers, v1alpha1.FinalizerRegistry) {
		t.Fatalf("Cache gone has finalizers %q: want %s, which holds it until its manifest is deleted", c.Finalizers, v1alpha1.FinalizerRegistry)
	}
	for _, pub := range []*v1alpha1.PublishedChain{gone, kept} {
		if got := e.latestStatus(ctx, pub.Repository); got != http.StatusOK {
			t.Fatalf("%s:latest answers %d before the delete, want 200", pub.Repository, got)
		}
	}

	start := time.Now()
	if err := e.Caches.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, pollInterval, deleteTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := e.cache(ctx, "gone")
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		last, _ := e.cache(ctx, "gone")
		t.Fatalf("Cache gone still exists %s after its deletion: finalizers %q, status %+v", deleteTimeout, last.Finalizers, last.Status)
	}
	t.Logf("Cache gone deleted everywhere in %s", time.Since(start).Round(10*time.Millisecond))
	for _, node := range []string{a, b} {
		n, err := e.Cluster.Node(node)
		if err != nil {
			t.Fatal(err)
		}
		if gen := e.CacheGeneration(ctx, n, "gone"); gen != 0 {
			t.Errorf("node %s still holds cache gone at generation %d", node, gen)
		}
	}
	e.waitEvent(ctx, "Cache", "gone", "RegistryManifestDeleted", gone.Repository, "sha256:")
	if got := e.latestStatus(ctx, gone.Repository); got != http.StatusNotFound {
		t.Errorf("%s:latest answers %d after the delete, want 404", gone.Repository, got)
	}
	if got := e.latestStatus(ctx, kept.Repository); got != http.StatusOK {
		t.Errorf("%s:latest of the live Cache answers %d, want 200", kept.Repository, got)
	}

	garbage, err := e.Cluster.RegistryGarbage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the registry's garbage collection would delete %d blobs", len(garbage))
	for _, l := range gone.Layers {
		if !garbage[l.Digest] {
			t.Errorf("the registry's garbage collection would keep layer %s of the deleted cache (it would delete %d blobs)", l.Digest, len(garbage))
		}
	}
	for _, l := range kept.Layers {
		if garbage[l.Digest] {
			t.Errorf("the registry's garbage collection would delete layer %s of the live cache kept", l.Digest)
		}
	}
}

// latestStatus is the HTTP status of a HEAD of repository:latest, asking
// for the OCI manifest the agents push (distribution answers 404 to a
// client that does not accept its type).
func (e *syncEnv) latestStatus(ctx context.Context, repository string) int {
	e.t.Helper()
	httpClient, err := e.Reg.HTTPClient()
	if err != nil {
		e.t.Fatal(err)
	}
	path := strings.TrimPrefix(repository, e.Reg.Address+"/")
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, "https://"+e.Reg.Address+"/v2/"+path+"/manifests/latest", nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.SetBasicAuth(e.Reg.Username, e.Reg.Password)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := httpClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
