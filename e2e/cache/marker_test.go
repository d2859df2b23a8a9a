//go:build e2e

package cache

import (
	"context"
	"path"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// TestCommitOnMarker checks the commit policy of CI systems whose pod's
// end says nothing about the job: GitHub ARC runners exit 0 whatever the
// job did, GitLab and Jenkins delete the pod when the job ends. Under
// on-marker the build's marker file decides, whatever the pod's phase, and
// even when the pod is deleted before it ends. The control directory never
// lands in the cache.
func TestCommitOnMarker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "marker"
	ann := cacheAnnotations(cacheName, v1alpha1.AnnotationCommit, string(v1alpha1.CommitOnMarker))
	control := path.Join("/cache", layerfs.ControlDir)
	mark := "mkdir -p " + control + " && touch " + path.Join(control, v1alpha1.MarkerCommit)

	pods := []struct {
		name, script string
		phase        corev1.PodPhase // "" for a pod deleted while it runs
		end          string
	}{
		// The runner's job passed, but its pod failed on the way out.
		{"marked", "echo marked > /cache/marked && " + mark + " && exit 1", corev1.PodFailed, "Committed"},
		{"unmarked", "echo unmarked > /cache/unmarked", corev1.PodSucceeded, "Discarded"},
		{"aborted", "echo aborted > /cache/aborted && " + mark + " && touch " + path.Join(control, v1alpha1.MarkerAbort), corev1.PodSucceeded, "Discarded"},
		// The CI deletes the pod as soon as the job is done.
		{"deleted", "echo deleted > /cache/deleted && " + mark + " && touch /tmp/done && sleep 3600", "", "Committed"},
	}
	for _, p := range pods {
		if _, err := e.CreatePod(ctx, e.cachePod(p.name, ann, p.script)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.WaitForPodPhase(ctx, "deleted", corev1.PodRunning); err != nil {
		t.Fatal(err)
	}
	e.exec(ctx, "deleted", "until [ -e /tmp/done ]; do sleep 0.2; done")
	if err := e.Client.CoreV1().Pods(e.Namespace).Delete(ctx, "deleted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.phase != "" {
			if _, err := e.WaitForPodPhase(ctx, p.name, p.phase); err != nil {
				t.Fatal(err)
			}
		}
		end := e.expectVolumeEnd(ctx, p.name, p.end)
		if p.end == "Discarded" && !strings.Contains(end.Event, string(v1alpha1.CommitOnMarker)) {
			t.Errorf("pod %s: Discarded Event %q does not say why (the marker)", p.name, end.Event)
		}
	}
	e.waitGeneration(ctx, cacheName, 2)

	check := e.runPod(ctx, e.cachePod("check", cacheAnnotations(cacheName), "ls -1A /cache"), corev1.PodSucceeded)
	if got, want := strings.Join(lines(e.logs(ctx, check.Name)), ","), "deleted,marked"; got != want {
		t.Errorf("the next pod sees %q in the cache, want %q (no control directory, no unmarked work)", got, want)
	}
}
