//go:build e2e

package cache

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestReadModeAndReaders checks the read paths and the namespace boundary:
// a read view of one's own cache is never committed; another namespace may
// not use a cache without a grant (an Event says how to grant it, and no
// volume is made), nor write it even with one; with a grant in
// spec.readers it reads the cache, and what it writes stays its own. A
// claim refused for lack of a grant gets its volume once the grant is
// there, without being recreated.
func TestReadModeAndReaders(t *testing.T) {
	t.Parallel()
	owner := newEnv(t)
	reader := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "trusted"
	ref := owner.Namespace + "/" + cacheName

	owner.runPod(ctx, owner.cachePod("seed", cacheAnnotations(cacheName), "echo seed > /cache/seed"), corev1.PodSucceeded)
	owner.expectVolumeEnd(ctx, "seed", "Committed")
	owner.waitGeneration(ctx, cacheName, 1)

	// Without a grant: refused, with the fix in the Event.
	read := "cat /cache/seed && echo reader > /cache/from-reader"
	for _, pod := range []*corev1.Pod{
		reader.cachePod("ungranted", cacheAnnotations(ref), read),
		reader.cachePod("write-other", cacheAnnotations(ref, v1alpha1.AnnotationMode, string(v1alpha1.ModeWrite)), read),
	} {
		if _, err := reader.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	reader.waitClaimRefused(ctx, "ungranted", "CacheAccessDenied", ref, reader.Namespace, "spec.readers")
	reader.waitClaimRefused(ctx, "write-other", "InvalidAnnotation", v1alpha1.AnnotationMode, owner.Namespace)

	c, err := owner.cache(ctx, cacheName)
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(c.DeepCopy())
	c.Spec.Readers = []string{reader.Namespace}
	if err := owner.Caches.Patch(ctx, c, patch); err != nil {
		t.Fatalf("granting namespace %s read access to Cache %s: %v", reader.Namespace, ref, err)
	}

	// A read view of one's own cache: readable and writable scratch space,
	// never committed.
	owner.runPod(ctx, owner.cachePod("own-read", cacheAnnotations(cacheName, v1alpha1.AnnotationMode, string(v1alpha1.ModeRead)),
		"cat /cache/seed && echo own-read > /cache/from-own-read"), corev1.PodSucceeded)
	if got := owner.logs(ctx, "own-read"); got != "seed\n" {
		t.Errorf("read view of the own cache shows %q, want %q", got, "seed\n")
	}
	end := owner.expectVolumeEnd(ctx, "own-read", "Discarded")
	if !strings.Contains(end.Event, "read-only view") {
		t.Errorf("Discarded Event %q does not say the volume was a read view", end.Event)
	}

	// With the grant: a new claim reads the cache at once, and the refused
	// one is retried and gets its volume too.
	reader.runPod(ctx, reader.cachePod("granted", cacheAnnotations(ref), read), corev1.PodSucceeded)
	for _, pod := range []string{"granted", "ungranted"} {
		if _, err := reader.WaitForPodPhase(ctx, pod, corev1.PodSucceeded); err != nil {
			t.Fatalf("after the grant: %v", err)
		}
		if got := reader.logs(ctx, pod); got != "seed\n" {
			t.Errorf("pod %s of the granted namespace reads %q, want %q", pod, got, "seed\n")
		}
		end := reader.expectVolumeEnd(ctx, pod, "Discarded")
		checkPVAnnotations(t, end.PV, map[string]string{v1alpha1.AnnotationCache: ref, v1alpha1.AnnotationMode: string(v1alpha1.ModeRead)})
	}
	reader.expectNoVolume(ctx, "write-other")

	// Nothing the readers wrote reached the cache.
	c = owner.waitGeneration(ctx, cacheName, 1)
	if n := owner.nodeEntry(c); n.LastWriter != owner.Namespace+"/seed" {
		t.Errorf("last writer = %q, want %s/seed", n.LastWriter, owner.Namespace)
	}
	owner.runPod(ctx, owner.cachePod("check", cacheAnnotations(cacheName), "ls -1A /cache"), corev1.PodSucceeded)
	if got := lines(owner.logs(ctx, "check")); strings.Join(got, ",") != "seed" {
		t.Errorf("the owner's next pod sees %q, want only [seed]", got)
	}
}
