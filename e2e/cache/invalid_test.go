//go:build e2e

package cache

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestInvalidAnnotations gives the node agent claims it must refuse: cache
// names that are not DNS-1123 labels (one of them a path escape), and
// unknown modes and commit policies. Each gets a Warning Event that names
// the annotation and its value, and no volume; nothing lands in the node's
// store, and the agent keeps serving: it does not restart, and a valid pod
// afterwards gets its cache.
func TestInvalidAnnotations(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	agent := e.agentPod(ctx)

	cases := []struct {
		pod         string
		annotations map[string]string
		key, value  string // what the Event must name
	}{
		{"upper-case", cacheAnnotations("Bad_Name"), v1alpha1.AnnotationCache, "Bad_Name"},
		{"path-escape", cacheAnnotations("../etc"), v1alpha1.AnnotationCache, "../etc"},
		{"two-slashes", cacheAnnotations("a/b/c"), v1alpha1.AnnotationCache, "a/b/c"},
		{"too-long", cacheAnnotations("a123456789012345678901234567890123456789012345678901234567890123"), v1alpha1.AnnotationCache, "a1234567890"},
		{"empty-name", cacheAnnotations(""), v1alpha1.AnnotationCache, `""`},
		{"no-cache", map[string]string{}, v1alpha1.AnnotationCache, "missing"},
		{"bad-mode", cacheAnnotations("good", v1alpha1.AnnotationMode, "rw"), v1alpha1.AnnotationMode, "rw"},
		{"bad-commit", cacheAnnotations("good", v1alpha1.AnnotationCommit, "sometimes"), v1alpha1.AnnotationCommit, "sometimes"},
	}
	for _, c := range cases {
		if _, err := e.CreatePod(ctx, e.cachePod(c.pod, c.annotations, "echo must not run")); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cases {
		e.waitClaimRefused(ctx, c.pod, "InvalidAnnotation", c.key, c.value)
		if p, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, c.pod, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
			t.Errorf("pod %s with a refused claim: %v, phase %v; want Pending", c.pod, err, phaseOf(p))
		}
	}
	if got := e.nodeCaches(ctx); len(got) != 0 {
		t.Errorf("refused claims left caches %q in the node's store", got)
	}
	if _, err := e.cache(ctx, "good"); err == nil {
		t.Errorf("a refused claim created Cache good")
	}

	// The system stays healthy: a valid claim next to the refused ones works.
	e.runPod(ctx, e.cachePod("valid", cacheAnnotations("good"), "echo ok > /cache/ok"), corev1.PodSucceeded)
	e.expectVolumeEnd(ctx, "valid", "Committed")
	e.waitGeneration(ctx, "good", 1)
	if got := e.nodeCaches(ctx); !slices.Equal(got, []string{"good"}) {
		t.Errorf("node store holds caches %q of the namespace, want [good]", got)
	}
	now := e.agentPod(ctx)
	if now.UID != agent.UID || restarts(now) != restarts(agent) || !podReady(now) {
		t.Errorf("node agent: pod %s (%d restarts) before, pod %s (%d restarts, ready %v) after; want the same pod, not restarted, ready",
			agent.Name, restarts(agent), now.Name, restarts(now), podReady(now))
	}
	for _, c := range cases {
		e.expectNoVolume(ctx, c.pod)
	}
}

func phaseOf(p *corev1.Pod) corev1.PodPhase {
	if p == nil {
		return ""
	}
	return p.Status.Phase
}
