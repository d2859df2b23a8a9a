//go:build e2e

package cache

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestConcurrentWriters runs two pods of one cache at the same time; each
// adds its own file and both write one shared file. Both commits land: the
// next pod sees both files (per-file last writer wins, never whole-cache
// last writer wins), and the shared file is one of the two versions.
func TestConcurrentWriters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "shared"

	writers := []string{"writer-a", "writer-b"}
	for _, w := range writers {
		// The pod holds its volume until the test has seen both pods run.
		script := "echo " + w + " > /cache/" + w + " && echo " + w + " > /cache/shared && " +
			"until [ -e /tmp/go ]; do sleep 1; done"
		if _, err := e.CreatePod(ctx, e.cachePod(w, cacheAnnotations(cacheName), script)); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range writers {
		if _, err := e.WaitForPodPhase(ctx, w, corev1.PodRunning); err != nil {
			t.Fatal(err)
		}
		// Both volumes were mounted on the empty cache, so both really
		// were concurrent views of the same generation.
		if got := e.volume(ctx, w).Annotations[v1alpha1.AnnotationBaseGeneration]; got != "0" {
			t.Errorf("volume of %s has base generation %q, want 0", w, got)
		}
	}
	// Each sees only its own writes while both run.
	for i, w := range writers {
		other := writers[1-i]
		if out := e.exec(ctx, w, "ls -1A /cache"); slices.Contains(lines(out), other) {
			t.Errorf("pod %s sees %s's file while both run: %q", w, other, out)
		}
	}
	for _, w := range writers {
		e.exec(ctx, w, "touch /tmp/go")
	}
	for _, w := range writers {
		if _, err := e.WaitForPodPhase(ctx, w, corev1.PodSucceeded); err != nil {
			t.Fatal(err)
		}
		e.expectVolumeEnd(ctx, w, "Committed")
	}
	e.waitGeneration(ctx, cacheName, 2)

	reader := e.runPod(ctx, e.cachePod("reader", cacheAnnotations(cacheName),
		"ls -1A /cache && echo --- && cat /cache/shared"), corev1.PodSucceeded)
	listing, shared, _ := strings.Cut(e.logs(ctx, reader.Name), "---\n")
	files := lines(listing)
	for _, w := range writers {
		if !slices.Contains(files, w) {
			t.Errorf("the next pod sees %q, want both writers' files %q", files, writers)
		}
	}
	if s := strings.TrimSpace(shared); !slices.Contains(writers, s) {
		t.Errorf("the shared file holds %q, want one writer's version %q", s, writers)
	}
}
