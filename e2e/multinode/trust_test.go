//go:build e2e && multinode

package multinode

import (
	"context"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// The scenarios of the chain's trust model: the owner of a cache decides
// where it is published, never a reader's class, and a node agent checks
// every chain it reads against the StorageClasses it serves before a byte
// moves.

// TestAReaderCannotRedirectTheOwnersPublishing: a namespace granted read
// access claims the owner's cache through a class whose registry is
// another prefix of the same registry, before the owner published
// anything and after. The Cache's chain stays in the owner's class's
// repository, before and after the grant is revoked, the owner's later
// commit lands there, and nothing is ever pushed under the reader's
// prefix.
func TestAReaderCannotRedirectTheOwnersPublishing(t *testing.T) {
	t.Parallel()
	owner, reader := newSyncEnv(t), newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := owner.node(0), owner.node(1)
	const cache = "shared"
	ref := owner.Namespace + "/" + cache
	otherPrefix := owner.Reg.Address + "/other-prefix"
	readerClass := owner.registryClass(ctx, "other-prefix", otherPrefix, owner.Reg.Secret)
	ownerRepo := owner.Reg.Repository + "/" + owner.Namespace + "/" + cache
	owner.createCache(ctx, cache, reader.Namespace)

	reader.run(ctx, reader.buildPod("early", b, ref, readerClass, "ls -A /cache"))
	if c, err := owner.cache(ctx, cache); err != nil || c.Status.Published != nil {
		t.Fatalf("after the reader's first claim the Cache's chain is %+v (%v); want none: a reader does not decide where the owner's cache goes", statusOf(c), err)
	}

	owner.run(ctx, owner.buildPod("seed", a, cache, "", "echo one > /cache/one"))
	pub := owner.waitPublished(ctx, cache, 1).Status.Published
	if pub.Repository != ownerRepo || pub.Secret != owner.Reg.Secret {
		t.Fatalf("chain in %s (Secret %q); want the owner's class's %s (Secret %q)", pub.Repository, pub.Secret, ownerRepo, owner.Reg.Secret)
	}
	out := reader.run(ctx, reader.buildPod("granted", b, ref, readerClass, "cat /cache/one"))
	if strings.TrimSpace(out) != "one" {
		t.Fatalf("the granted reader on %s read %q; want the owner's file, pulled from the owner's repository", b, out)
	}

	owner.setReaders(ctx, cache)
	if _, err := reader.CreatePod(ctx, reader.buildPod("revoked", b, ref, readerClass, "cat /cache/one")); err != nil {
		t.Fatal(err)
	}
	reader.waitEvent(ctx, "PersistentVolumeClaim", "revoked-cache", "CacheAccessDenied", reader.Namespace, "spec.readers")
	owner.run(ctx, owner.buildPod("after", a, cache, "", "echo two > /cache/two"))
	pub = owner.waitPublished(ctx, cache, 2).Status.Published
	if pub.Repository != ownerRepo || pub.Secret != owner.Reg.Secret {
		t.Errorf("after the revocation the chain is in %s (Secret %q); want %s (Secret %q)", pub.Repository, pub.Secret, ownerRepo, owner.Reg.Secret)
	}
	for repo, want := range map[string]bool{ownerRepo: true, otherPrefix + "/" + owner.Namespace + "/" + cache: false} {
		if got := owner.repositoryExists(ctx, repo); got != want {
			t.Errorf("repository %s exists: %v, want %v", repo, got, want)
		}
	}
}

// TestAChainOfAnotherRepositoryOrSecretIsRefused: the test, as the node
// agents' service account, writes status.published of a Cache to name another tenant's repository
// (with that tenant's chain), or a Secret no class pairs with the
// registry's prefix. A reader's build on the node that lacks the cache
// finds nothing of either chain in its volume, and Events on the claim
// and the Cache name the field, its value and what the agent expected.
func TestAChainOfAnotherRepositoryOrSecretIsRefused(t *testing.T) {
	t.Parallel()
	owner, victim, reader := newSyncEnv(t), newSyncEnv(t), newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := owner.node(0), owner.node(1)

	victim.run(ctx, victim.buildPod("private", a, "maven", "", "echo victim > /cache/private"))
	victimPub := victim.waitPublished(ctx, "maven", 1).Status.Published
	for i, tc := range []struct {
		cache, field, value string
		change              func(*v1alpha1.PublishedChain)
	}{
		{"by-repository", "status.published.repository", victimPub.Repository, func(p *v1alpha1.PublishedChain) {
			*p = *victimPub.DeepCopy()
		}},
		{"by-secret", "status.published.secret", "layercache-admin-creds", func(p *v1alpha1.PublishedChain) {
			p.Secret = "layercache-admin-creds"
		}},
	} {
		owner.createCache(ctx, tc.cache, reader.Namespace)
		owner.run(ctx, owner.buildPod("seed-"+tc.cache, a, tc.cache, "", "echo own > /cache/own"))
		owner.waitPublished(ctx, tc.cache, 1)
		owner.editPublished(ctx, tc.cache, tc.change)

		pod := "read-" + tc.cache
		out := reader.run(ctx, reader.buildPod(pod, b, owner.Namespace+"/"+tc.cache, "",
			"cat /cache/private /cache/own 2>/dev/null || echo nothing"))
		if strings.TrimSpace(out) != "nothing" {
			t.Errorf("case %d (%s): the reader's volume on %s holds %q; want nothing fetched", i, tc.cache, b, out)
		}
		reader.waitEvent(ctx, "PersistentVolumeClaim", pod+"-cache", "UntrustedChain", tc.field, tc.value, "fetched nothing")
		owner.waitEvent(ctx, "Cache", tc.cache, "UntrustedChain", tc.field, tc.value, b)
	}
}

// registryClass is a class of the registry's provisioner with another
// registry prefix and Secret, and no other parameters; it is deleted with
// the test.
func (e *syncEnv) registryClass(ctx context.Context, suffix, prefix, secret string) string {
	e.t.Helper()
	return e.newClass(ctx, suffix, map[string]string{"registry": prefix, "registrySecret": secret})
}

// createCache creates Cache name of the scenario's namespace that grants
// readers.
func (e *syncEnv) createCache(ctx context.Context, name string, readers ...string) {
	e.t.Helper()
	c := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: name}, Spec: v1alpha1.CacheSpec{Readers: readers}}
	if err := e.Caches.Create(ctx, c); err != nil {
		e.t.Fatalf("create Cache %s/%s: %v", e.Namespace, name, err)
	}
}

// setReaders replaces the Cache's spec.readers.
func (e *syncEnv) setReaders(ctx context.Context, name string, readers ...string) {
	e.t.Helper()
	c, err := e.cache(ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	patch := client.MergeFrom(c.DeepCopy())
	c.Spec.Readers = readers
	if err := e.Caches.Patch(ctx, c, patch); err != nil {
		e.t.Fatalf("set spec.readers of Cache %s/%s to %v: %v", e.Namespace, name, readers, err)
	}
}

// editPublished changes the Cache's status.published through the status
// subresource as the node agents' service account, the only writer
// ValidatingAdmissionPolicy layercache-agent-state lets change it (e2e/cache's
// TestATenantCannotForgeAgentState checks that it refuses a tenant): the
// agents check every chain all the same, whoever wrote it.
func (e *syncEnv) editPublished(ctx context.Context, name string, change func(*v1alpha1.PublishedChain)) {
	e.t.Helper()
	c, err := e.cache(ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	agent, err := client.New(e.AsLayercache("layercache-node", e.node(0)), client.Options{Scheme: e.Caches.Scheme()})
	if err != nil {
		e.t.Fatal(err)
	}
	patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
	change(c.Status.Published)
	if err := agent.Status().Patch(ctx, c, patch); err != nil {
		e.t.Fatalf("patch status.published of Cache %s/%s: %v", e.Namespace, name, err)
	}
}

// repositoryExists asks the registry whether repo (HOST:PORT/PATH) has
// tags: the agents tag every repository they publish to.
func (e *syncEnv) repositoryExists(ctx context.Context, repo string) bool {
	e.t.Helper()
	httpClient, err := e.Reg.HTTPClient()
	if err != nil {
		e.t.Fatal(err)
	}
	path := strings.TrimPrefix(repo, e.Reg.Address+"/")
	resp, err := get(ctx, httpClient, "https://"+e.Reg.Address+"/v2/"+path+"/tags/list", e.Reg.Username, e.Reg.Password)
	if err != nil {
		e.t.Fatal(err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return true
	case http.StatusNotFound:
		return false
	}
	e.t.Fatalf("GET tags of %s: %s", repo, resp.Status)
	return false
}
