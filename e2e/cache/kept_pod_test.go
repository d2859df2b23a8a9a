//go:build e2e

package cache

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// keptPodWatch is how long TestKeptJobPodIsQuiet watches a namespace
// whose completed Job pod stays, as users keep them for hours.
const keptPodWatch = 10 * time.Minute

// TestKeptJobPodIsQuiet is the regression test of a loop that flooded the
// API server: while a completed Job pod was kept, the manager deleted its
// ephemeral claim and the ephemeral-volume controller recreated it, some
// 14 writes a second for as long as the pod stayed. Now the node agent
// commits when the pod ends and leaves the claim to its pod.
//
// The build runs as a non-root user, as CI builds do. The Job is left as a
// user leaves it; for keptPodWatch the namespace's claims, PVs and Events
// must stay exactly as they were once the volume ended: the same objects,
// untouched (same resourceVersion), and no new Event.
func TestKeptJobPodIsQuiet(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), keptPodWatch+2*time.Minute+scenarioTimeout)
	defer cancel()
	const cacheName = "kept"

	job := e.cacheJob("kept", cacheAnnotations(cacheName), "id -u > /cache/uid && echo built > /cache/out")
	job.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: new(int64(1000)), RunAsGroup: new(int64(1000)), RunAsNonRoot: new(true)}
	pod := e.runJob(ctx, job)
	e.expectVolumeEnd(ctx, pod.Name, "Committed")
	e.waitGeneration(ctx, cacheName, 1)

	// Kubernetes' own components record their Events about the Job and
	// its pod asynchronously; let those land first. A namespace that never
	// settles is the loop itself.
	var before string
	err := wait.PollUntilContextTimeout(ctx, 15*time.Second, 2*time.Minute, false, func(ctx context.Context) (bool, error) {
		now := e.namespaceWrites(ctx)
		settled := now == before
		before = now
		return settled, nil
	})
	if err != nil {
		t.Fatalf("namespace %s did not settle after its Job completed: %v; last: %s", e.Namespace, err, before)
	}
	t.Logf("watching namespace %s for %s with its completed Job pod kept: %s", e.Namespace, keptPodWatch, before)
	deadline := time.Now().Add(keptPodWatch)
	err = wait.PollUntilContextTimeout(ctx, 30*time.Second, keptPodWatch+time.Minute, false, func(ctx context.Context) (bool, error) {
		if now := e.namespaceWrites(ctx); now != before {
			return false, fmt.Errorf("the namespace changed while its completed pod was kept:\nbefore %s\nnow    %s", before, now)
		}
		return time.Now().After(deadline), nil
	})
	if err != nil {
		t.Fatal(err)
	}

	check := e.runPod(ctx, e.cachePod("check", cacheAnnotations(cacheName), "cat /cache/uid /cache/out"), corev1.PodSucceeded)
	if got, want := e.logs(ctx, check.Name), "1000\nbuilt\n"; got != want {
		t.Errorf("the next pod reads %q from the cache, want %q", got, want)
	}
}

// namespaceWrites summarises what writes to a namespace's claims, their
// PVs, its Caches and its Events would change: names, UIDs,
// resourceVersions, counts.
func (e *env) namespaceWrites(ctx context.Context) string {
	e.t.Helper()
	claims, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	events, err := e.Client.CoreV1().Events(e.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var eventCount int32
	for _, ev := range events.Items {
		eventCount += max(ev.Count, 1)
		if ev.Series != nil {
			eventCount += ev.Series.Count
		}
	}
	out := fmt.Sprintf("%d Events (%d objects);", eventCount, len(events.Items))
	var caches v1alpha1.CacheList
	if err := e.Caches.List(ctx, &caches, client.InNamespace(e.Namespace)); err != nil {
		e.t.Fatal(err)
	}
	for _, c := range caches.Items {
		out += fmt.Sprintf(" Cache %s rv %s;", c.Name, c.ResourceVersion)
	}
	for _, c := range claims.Items {
		out += fmt.Sprintf(" claim %s uid %s rv %s phase %s;", c.Name, c.UID, c.ResourceVersion, c.Status.Phase)
		if c.Spec.VolumeName == "" {
			continue
		}
		pv, err := e.Client.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		out += fmt.Sprintf(" PV %s rv %s phase %s;", pv.Name, pv.ResourceVersion, pv.Status.Phase)
	}
	return out
}
