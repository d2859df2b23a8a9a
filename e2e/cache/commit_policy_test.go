//go:build e2e

package cache

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestCommitPolicy checks which pod outcomes reach the cache: a failed
// build must not poison it under the default policy (on-success), commit:
// always keeps even a failed pod's work (a test run's partial cache), and
// commit: never keeps nothing. The three pods use one cache at the same
// time, so each starts from the empty cache.
func TestCommitPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "policy"

	cases := []struct {
		pod     string
		commit  v1alpha1.CommitPolicy // "" leaves the annotation out
		exit    string
		phase   corev1.PodPhase
		outcome string
		end     string // the Event reason on the PV
		kept    bool
	}{
		{pod: "failed-default", exit: "1", phase: corev1.PodFailed, outcome: v1alpha1.OutcomeFailed, end: "Discarded"},
		{pod: "failed-always", commit: v1alpha1.CommitAlways, exit: "1", phase: corev1.PodFailed, outcome: v1alpha1.OutcomeFailed, end: "Committed", kept: true},
		{pod: "succeeded-never", commit: v1alpha1.CommitNever, exit: "0", phase: corev1.PodSucceeded, outcome: v1alpha1.OutcomeSucceeded, end: "Discarded"},
	}
	for _, c := range cases {
		ann := cacheAnnotations(cacheName)
		if c.commit != "" {
			ann[v1alpha1.AnnotationCommit] = string(c.commit)
		}
		pod := e.cachePod(c.pod, ann, "echo "+c.pod+" > /cache/"+c.pod+" && exit "+c.exit)
		if _, err := e.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cases {
		if _, err := e.WaitForPodPhase(ctx, c.pod, c.phase); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cases {
		end := e.expectVolumeEnd(ctx, c.pod, c.end)
		if got := end.PV.Annotations[v1alpha1.AnnotationPodOutcome]; got != c.outcome {
			t.Errorf("pod %s: PV outcome %q, want %q", c.pod, got, c.outcome)
		}
		if c.end == "Discarded" && !strings.Contains(end.Event, "commit policy is") {
			t.Errorf("pod %s: Discarded Event %q does not say why (the commit policy)", c.pod, end.Event)
		}
	}
	e.waitGeneration(ctx, cacheName, 1)

	check := e.runPod(ctx, e.cachePod("check", cacheAnnotations(cacheName), "ls -1A /cache"), corev1.PodSucceeded)
	var want []string
	for _, c := range cases {
		if c.kept {
			want = append(want, c.pod)
		}
	}
	if got := lines(e.logs(ctx, check.Name)); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("the next pod sees %q in the cache, want %q (only the commit: always pod's file)", got, want)
	}
}
