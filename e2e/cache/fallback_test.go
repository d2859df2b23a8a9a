//go:build e2e

package cache

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestFallback is the branch cache of issue 22 on one node, with the
// default class: a pull request's cache starts from main's, keeps its own
// commits, and never writes main's.
//
// main has content; pr-1's first build, with fallback main, sees main's
// files and commits: its PV, an Event and the Cache say it was seeded from
// main. main is unchanged. pr-1's second build sees both and is not seeded
// (the restore-keys rule). A failed first build of pr-2 commits nothing,
// so its next build starts from main again, at main's newest generation.
// A fallback to another namespace's cache is refused without a grant in
// its spec.readers, and works once granted.
func TestFallback(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	mainRef := e.Namespace + "/main"
	withFallback := func(cache string) map[string]string {
		return cacheAnnotations(cache, v1alpha1.AnnotationFallback, "main")
	}

	e.runPod(ctx, e.cachePod("main-1", cacheAnnotations("main"), "echo main-1 > /cache/main-1"), corev1.PodSucceeded)
	e.expectVolumeEnd(ctx, "main-1", "Committed")
	e.waitGeneration(ctx, "main", 1)

	// pr-1's first build starts from main and commits pr-1's first layer.
	e.runPod(ctx, e.cachePod("pr-1-a", withFallback("pr-1"), "cat /cache/main-1 && echo pr-1-a > /cache/pr-1-a"), corev1.PodSucceeded)
	if got := e.logs(ctx, "pr-1-a"); got != "main-1\n" {
		t.Errorf("pr-1's first build read %q, want main's file (%q)", got, "main-1\n")
	}
	end := e.expectVolumeEnd(ctx, "pr-1-a", "Committed")
	checkPVAnnotations(t, end.PV, map[string]string{
		v1alpha1.AnnotationCache:          e.Namespace + "/pr-1",
		v1alpha1.AnnotationSeededFrom:     mainRef + "@1",
		v1alpha1.AnnotationBaseGeneration: "0",
	})
	ev := e.waitEvent(ctx, e.Namespace, "PersistentVolumeClaim", claimName("pr-1-a"), func(ev *corev1.Event) bool {
		return ev.Reason == "SeededFromFallback"
	})
	if !strings.Contains(ev.Message, "fallback "+mainRef+" at generation 1") || !strings.Contains(ev.Message, "never written") {
		t.Errorf("SeededFromFallback Event says %q; want it to name %s at generation 1 and say the fallback is never written", ev.Message, mainRef)
	}
	c := e.waitGeneration(ctx, "pr-1", 1)
	if n := e.nodeEntry(c); n.SeededFrom == nil || n.SeededFrom.String() != mainRef+"@1" || n.Layers != 2 {
		t.Errorf("pr-1's replica = %+v; want 2 layers (main's and its own), seeded from %s@1", *n, mainRef)
	}
	e.waitSeededFrom(ctx, "pr-1", mainRef+"@1")
	checkCacheTable(ctx, t, e, "pr-1", map[string]string{"Generation": "1", "Seeded From": mainRef + "@1"})

	// main is unchanged: generation 1, one layer, only its own file.
	c = e.waitGeneration(ctx, "main", 1)
	if n := e.nodeEntry(c); n.Layers != 1 || n.SeededFrom != nil || c.Status.SeededFrom != "" {
		t.Errorf("main's status after pr-1's commit = %s; want 1 layer, not seeded", statusString(c))
	}
	e.runPod(ctx, e.cachePod("main-check", cacheAnnotations("main", v1alpha1.AnnotationMode, string(v1alpha1.ModeRead)), "ls -1A /cache"), corev1.PodSucceeded)
	if got := lines(e.logs(ctx, "main-check")); strings.Join(got, ",") != "main-1" {
		t.Errorf("main holds %q after pr-1's build, want only [main-1]", got)
	}

	// pr-1's second build sees main's file and its own first build's, and
	// starts from pr-1 itself: its fallback is ignored now.
	e.runPod(ctx, e.cachePod("pr-1-b", withFallback("pr-1"), "cat /cache/main-1 /cache/pr-1-a && echo pr-1-b > /cache/pr-1-b"), corev1.PodSucceeded)
	if got, want := e.logs(ctx, "pr-1-b"), "main-1\npr-1-a\n"; got != want {
		t.Errorf("pr-1's second build read %q, want %q", got, want)
	}
	end = e.expectVolumeEnd(ctx, "pr-1-b", "Committed")
	if got, ok := end.PV.Annotations[v1alpha1.AnnotationSeededFrom]; ok || end.PV.Annotations[v1alpha1.AnnotationBaseGeneration] != "1" {
		t.Errorf("pr-1's second volume: seeded from %q, base generation %q; want not seeded, base 1", got, end.PV.Annotations[v1alpha1.AnnotationBaseGeneration])
	}
	e.waitGeneration(ctx, "pr-1", 2)
	e.waitSeededFrom(ctx, "pr-1", mainRef+"@1") // what it was created on stays

	// main moves on; a failed first build of pr-2 commits nothing, so its
	// next build starts from main again, at main's newest generation.
	e.runPod(ctx, e.cachePod("main-2", cacheAnnotations("main"), "echo main-2 > /cache/main-2"), corev1.PodSucceeded)
	e.expectVolumeEnd(ctx, "main-2", "Committed")
	e.waitGeneration(ctx, "main", 2)
	e.runPod(ctx, e.cachePod("pr-2-a", withFallback("pr-2"), "cat /cache/main-1 && echo pr-2-a > /cache/pr-2-a && exit 1"), corev1.PodFailed)
	end = e.expectVolumeEnd(ctx, "pr-2-a", "Discarded")
	checkPVAnnotations(t, end.PV, map[string]string{v1alpha1.AnnotationSeededFrom: mainRef + "@2"})
	if c, err := e.cache(ctx, "pr-2"); err != nil || c.Status.Generation != 0 || c.Status.SeededFrom != "" {
		t.Errorf("Cache pr-2 after its failed first build: %s, %v; want no generation, not seeded", statusString(c), err)
	}
	e.runPod(ctx, e.cachePod("pr-2-b", withFallback("pr-2"), "ls -1A /cache && echo pr-2-b > /cache/pr-2-b"), corev1.PodSucceeded)
	if got := lines(e.logs(ctx, "pr-2-b")); strings.Join(got, ",") != "main-1,main-2" {
		t.Errorf("pr-2's build after the failed one sees %q, want main's files only [main-1 main-2]", got)
	}
	end = e.expectVolumeEnd(ctx, "pr-2-b", "Committed")
	checkPVAnnotations(t, end.PV, map[string]string{v1alpha1.AnnotationSeededFrom: mainRef + "@2"})
	e.waitGeneration(ctx, "pr-2", 1)
	e.waitSeededFrom(ctx, "pr-2", mainRef+"@2")

	// Another namespace's fallback needs a grant, as a read claim does.
	other := newEnv(t)
	cross := other.cachePod("cross", cacheAnnotations("pr-x", v1alpha1.AnnotationFallback, mainRef),
		"cat /cache/main-1 /cache/main-2 && echo cross > /cache/cross")
	if _, err := other.CreatePod(ctx, cross); err != nil {
		t.Fatal(err)
	}
	other.waitClaimRefused(ctx, "cross", "CacheAccessDenied", v1alpha1.AnnotationFallback, mainRef, other.Namespace, "spec.readers")
	c, err := e.cache(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(c.DeepCopy())
	c.Spec.Readers = []string{other.Namespace}
	if err := e.Caches.Patch(ctx, c, patch); err != nil {
		t.Fatalf("granting namespace %s read access to Cache %s: %v", other.Namespace, mainRef, err)
	}
	// The refused claim is retried and gets its volume, seeded from main.
	if _, err := other.WaitForPodPhase(ctx, "cross", corev1.PodSucceeded); err != nil {
		t.Fatalf("after the grant: %v", err)
	}
	if got, want := other.logs(ctx, "cross"), "main-1\nmain-2\n"; got != want {
		t.Errorf("the granted namespace's build read %q, want %q", got, want)
	}
	end = other.expectVolumeEnd(ctx, "cross", "Committed")
	checkPVAnnotations(t, end.PV, map[string]string{v1alpha1.AnnotationSeededFrom: mainRef + "@2"})
	other.waitGeneration(ctx, "pr-x", 1)
	other.waitSeededFrom(ctx, "pr-x", mainRef+"@2")
	// Seeding never writes the fallback.
	c = e.waitGeneration(ctx, "main", 2)
	if n := e.nodeEntry(c); n.Layers != 2 || n.LastWriter != e.Namespace+"/main-2" {
		t.Errorf("main after the other namespace's build: %s; want 2 layers, last written by main-2", statusString(c))
	}
}

// waitSeededFrom waits until Cache name's derived status.seededFrom is
// want (the manager derives it from the replicas).
func (e *env) waitSeededFrom(ctx context.Context, name, want string) {
	e.t.Helper()
	var last *v1alpha1.Cache
	err := wait.PollUntilContextTimeout(ctx, pollInterval, statusTimeout, true, func(ctx context.Context) (bool, error) {
		c, err := e.cache(ctx, name)
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		last = c
		return c.Status.SeededFrom == want, nil
	})
	if err != nil {
		e.t.Fatalf("Cache %s/%s status.seededFrom did not become %q within %s: %v; last status: %s",
			e.Namespace, name, want, statusTimeout, err, statusString(last))
	}
}
