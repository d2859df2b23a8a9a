//go:build e2e

package cache

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// keptPodWatch is how long TestKeptJobPodIsQuiet watches a namespace
// whose completed Job pod stays, as users keep them for hours: six of
// the node agent's periodic passes (--resync-interval 1m), the only
// periodic work that could touch it in that time (it was 10 minutes;
// the loop it guards against wrote 14 times a second).
const keptPodWatch = 6 * time.Minute

// TestKeptJobPodIsQuiet is the regression test of a loop that flooded the
// API server: while a completed Job pod was kept, the manager deleted its
// ephemeral claim and the ephemeral-volume controller recreated it, some
// 14 writes a second for as long as the pod stayed. Now the node agent
// commits when the pod ends and leaves the claim to its pod.
//
// The build runs as a non-root user, as CI builds do. The Job is left as a
// user leaves it; for keptPodWatch the namespace's claims, PVs and Events
// must stay exactly as they were once the volume ended: the same objects,
// untouched (same resourceVersion), and no new Event. Both layouts, side
// by side, and a CSI inline volume (class "csi" here).
func TestKeptJobPodIsQuiet(t *testing.T) {
	t.Parallel()
	for _, class := range []string{v1alpha1.StorageClassName, v1alpha1.SnapshotStorageClassName, csiClass} {
		t.Run(class, func(t *testing.T) {
			t.Parallel()
			keptJobPodIsQuiet(t, class)
		})
	}
}

// csiClass stands for a CSI inline volume among the classes of a
// scenario.
const csiClass = "csi"

func keptJobPodIsQuiet(t *testing.T, class string) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), keptPodWatch+2*time.Minute+scenarioTimeout)
	defer cancel()
	const cacheName = "kept"

	script := "id -u > /cache/uid && echo built > /cache/out"
	job := e.cacheJob("kept", cacheAnnotations(cacheName), script)
	job.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: new(int64(1000)), RunAsGroup: new(int64(1000)), RunAsNonRoot: new(true)}
	if class == csiClass {
		job.Spec.Template.Spec = e.csiPod("kept", csiVolume(cacheName), script).Spec
	} else {
		useClass(&job.Spec.Template.Spec, class, "1Gi")
	}
	pod := e.runJob(ctx, job)
	if class == csiClass {
		e.expectCSIEnd(ctx, pod.Name, "Committed")
	} else {
		e.expectVolumeEnd(ctx, pod.Name, "Committed")
	}
	e.waitGeneration(ctx, cacheName, 1)

	// Kubernetes' own components record their Events about the Job and
	// its pod asynchronously; let those land first. The kept pod is
	// watched too: the agent held it (finalizer layercache.dev/build-end)
	// and lifted the hold at its end, and must not touch it again.
	e.ExpectQuiet(ctx, 2*time.Minute, keptPodWatch, corev1.SchemeGroupVersion.WithResource("pods"))

	check := e.cachePod("check", cacheAnnotations(cacheName), "cat /cache/uid /cache/out")
	if class == csiClass {
		check = e.csiPod("check", csiVolume(cacheName), "cat /cache/uid /cache/out")
	} else {
		useClass(&check.Spec, class, "1Gi")
	}
	check = e.runPod(ctx, check, corev1.PodSucceeded)
	if got, want := e.logs(ctx, check.Name), "1000\nbuilt\n"; got != want {
		t.Errorf("the next pod reads %q from the cache, want %q", got, want)
	}
}
