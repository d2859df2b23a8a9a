//go:build e2e

package cache

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestDeleteCacheClearsNode deletes a Cache while a pod still has a volume
// of it: the node agent removes the cache from the node and deletes its
// CacheReplica, the Cache goes away, a new pod naming the cache starts
// empty, and the old pod's changes, committed after the deletion, are
// dropped instead of reviving the deleted contents.
func TestDeleteCacheClearsNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "doomed"

	e.runPod(ctx, e.cachePod("seed", cacheAnnotations(cacheName), "echo old > /cache/old"), corev1.PodSucceeded)
	e.expectVolumeEnd(ctx, "seed", "Committed")
	e.waitGeneration(ctx, cacheName, 1)
	if got := e.nodeCaches(ctx); !slices.Contains(got, cacheName) {
		t.Fatalf("node store holds caches %q of the namespace, want %s", got, cacheName)
	}

	e.runPod(ctx, e.cachePod("holder", cacheAnnotations(cacheName),
		"echo holder > /cache/holder && until [ -e /tmp/go ]; do sleep 1; done"), corev1.PodRunning)

	c, err := e.cache(ctx, cacheName)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Caches.Delete(ctx, c); err != nil {
		t.Fatalf("deleting Cache %s/%s: %v", e.Namespace, cacheName, err)
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, pollInterval, statusTimeout, true, func(ctx context.Context) (bool, error) {
		c, err := e.cache(ctx, cacheName)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err == nil {
			last = "finalizers " + strings.Join(c.Finalizers, ",") + ", status " + statusString(c)
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("Cache %s/%s was not removed within %s: %v (last: %s)", e.Namespace, cacheName, statusTimeout, err, last)
	}
	if got := e.nodeCaches(ctx); slices.Contains(got, cacheName) {
		t.Errorf("after the Cache's deletion the node store still holds cache %s (caches of the namespace: %q)", cacheName, got)
	}
	// The running pod keeps its volume as it was.
	if got := e.exec(ctx, "holder", "cat /cache/old /cache/holder"); got != "old\nholder\n" {
		t.Errorf("the running pod's volume reads %q after the deletion, want %q", got, "old\nholder\n")
	}

	fresh := e.runPod(ctx, e.cachePod("fresh", cacheAnnotations(cacheName),
		"ls -1A /cache && echo fresh > /cache/fresh"), corev1.PodSucceeded)
	if got := e.logs(ctx, fresh.Name); got != "" {
		t.Errorf("a new pod of the deleted cache sees %q, want an empty cache", got)
	}
	end := e.expectVolumeEnd(ctx, fresh.Name, "Committed")
	checkPVAnnotations(t, end.PV, map[string]string{v1alpha1.AnnotationBaseGeneration: "0"})
	e.waitGeneration(ctx, cacheName, 1)

	e.exec(ctx, "holder", "touch /tmp/go")
	if _, err := e.WaitForPodPhase(ctx, "holder", corev1.PodSucceeded); err != nil {
		t.Fatal(err)
	}
	e.expectVolumeEnd(ctx, "holder", "CommitDropped")

	e.runPod(ctx, e.cachePod("check", cacheAnnotations(cacheName), "ls -1A /cache"), corev1.PodSucceeded)
	if got := lines(e.logs(ctx, "check")); !slices.Equal(got, []string{"fresh"}) {
		t.Errorf("the cache after deletion and a new commit holds %q, want only [fresh]", got)
	}
	e.waitGeneration(ctx, cacheName, 1)
}
