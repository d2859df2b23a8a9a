//go:build e2e

package cache

import (
	"context"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// csiVolume is a layercache CSI inline volume of the cache, with the
// attributes given as key-value pairs.
func csiVolume(cache string, kv ...string) corev1.Volume {
	attrs := map[string]string{"cache": cache}
	for i := 0; i+1 < len(kv); i += 2 {
		attrs[kv[i]] = kv[i+1]
	}
	return corev1.Volume{Name: volumeName, VolumeSource: corev1.VolumeSource{
		CSI: &corev1.CSIVolumeSource{Driver: v1alpha1.CSIDriverName, VolumeAttributes: attrs},
	}}
}

// csiPod is cachePod with a CSI inline volume instead of a claim, run as
// a non-root user as CI builds are.
func (e *env) csiPod(name string, volume corev1.Volume, script string) *corev1.Pod {
	pod := e.cachePod(name, nil, script)
	pod.Spec.Volumes = []corev1.Volume{volume}
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: new(int64(1000)), RunAsGroup: new(int64(1000)), RunAsNonRoot: new(true)}
	return pod
}

// expectCSIEnd waits until the node agent has ended the CSI volume of pod
// and checks it ended as want (Committed or Discarded), exactly once.
func (e *env) expectCSIEnd(ctx context.Context, pod, want string) *corev1.Event {
	e.t.Helper()
	return e.expectCSIEndWithin(ctx, eventTimeout, pod, want)
}

// expectCSIEndWithin is expectCSIEnd for an end that may take up to
// timeout to come.
func (e *env) expectCSIEndWithin(ctx context.Context, timeout time.Duration, pod, want string) *corev1.Event {
	e.t.Helper()
	isEnd := func(ev *corev1.Event) bool { _, ok := endReasons[ev.Reason]; return ok }
	ev := e.waitEventWithin(ctx, timeout, isEnd, eventSubject{e.Namespace, "Pod", pod})
	if ev.Reason != want {
		e.t.Errorf("CSI volume of pod %s: %s (%q), want %s", pod, ev.Reason, ev.Message, want)
	}
	if ev.Count > 1 || ev.Series != nil {
		e.t.Errorf("CSI volume of pod %s ended more than once: %+v", pod, ev)
	}
	return ev
}

// expectNoClaims checks that the namespace's CSI pods made no claim and no
// PV: that is the point of CSI volumes.
func (e *env) expectNoClaims(ctx context.Context) {
	e.t.Helper()
	claims, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.pvs.mu.Lock()
	pvs := len(e.pvs.byClaim)
	e.pvs.mu.Unlock()
	if len(claims.Items) != 0 || pvs != 0 {
		e.t.Errorf("CSI volumes made %d claims and %d PVs, want none", len(claims.Items), pvs)
	}
}

// TestCSI runs build pods with CSI inline volumes as users do: plain pods
// and a kept Job reusing one cache, a failed pod, on-marker, a refused
// attribute, and a claim and a CSI volume of one cache at once.
func TestCSI(t *testing.T) {
	t.Parallel()
	t.Run("reuse", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
		defer cancel()
		const cacheName = "csi"
		e.runPod(ctx, e.csiPod("first", csiVolume(cacheName), "id -u > /cache/uid && echo first > /cache/first"), corev1.PodSucceeded)
		e.expectCSIEnd(ctx, "first", "Committed")
		e.waitGeneration(ctx, cacheName, 1)

		// A Job's pod, kept after it completed, as users keep them.
		job := e.cacheJob("second", nil, "cat /cache/first && echo second > /cache/second")
		job.Spec.Template.Spec = e.csiPod("second", csiVolume(cacheName), "cat /cache/first && echo second > /cache/second").Spec
		pod := e.runJob(ctx, job)
		if got := e.logs(ctx, pod.Name); got != "first\n" {
			t.Errorf("the Job's pod read %q from the cache, want the first pod's file", got)
		}
		e.expectCSIEnd(ctx, pod.Name, "Committed")
		e.waitGeneration(ctx, cacheName, 2)

		check := e.runPod(ctx, e.csiPod("check", csiVolume(cacheName), "ls -1A /cache && cat /cache/uid"), corev1.PodSucceeded)
		if got, want := lines(e.logs(ctx, check.Name)), []string{"first", "second", "uid", "1000"}; !slices.Equal(got, want) {
			t.Errorf("the next pod sees %q, want %q", got, want)
		}
		e.expectNoClaims(ctx)
	})

	t.Run("failed pod discards", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
		defer cancel()
		e.runPod(ctx, e.csiPod("ok", csiVolume("failed"), "echo ok > /cache/ok"), corev1.PodSucceeded)
		e.expectCSIEnd(ctx, "ok", "Committed")
		e.runPod(ctx, e.csiPod("broken", csiVolume("failed"), "echo broken > /cache/broken && exit 3"), corev1.PodFailed)
		ev := e.expectCSIEnd(ctx, "broken", "Discarded")
		if !strings.Contains(ev.Message, "failed") {
			t.Errorf("Discarded Event %q does not say the pod failed", ev.Message)
		}
		check := e.runPod(ctx, e.csiPod("check", csiVolume("failed"), "ls -1A /cache"), corev1.PodSucceeded)
		if got := lines(e.logs(ctx, check.Name)); !slices.Equal(got, []string{"ok"}) {
			t.Errorf("after a failed pod the cache holds %q, want only the good pod's file", got)
		}
	})

	t.Run("on-marker", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
		defer cancel()
		control := path.Join(mountPath, layerfs.ControlDir)
		mark := "mkdir -p " + control + " && touch " + path.Join(control, v1alpha1.MarkerCommit)
		vol := csiVolume("marker", "commit", string(v1alpha1.CommitOnMarker))
		e.runPod(ctx, e.csiPod("marked", vol, "echo marked > /cache/marked && "+mark+" && exit 1"), corev1.PodFailed)
		e.expectCSIEnd(ctx, "marked", "Committed")
		e.runPod(ctx, e.csiPod("unmarked", vol, "echo unmarked > /cache/unmarked"), corev1.PodSucceeded)
		e.expectCSIEnd(ctx, "unmarked", "Discarded")
		check := e.runPod(ctx, e.csiPod("check", csiVolume("marker"), "ls -1A /cache"), corev1.PodSucceeded)
		if got := lines(e.logs(ctx, check.Name)); !slices.Equal(got, []string{"marked"}) {
			t.Errorf("the cache holds %q, want only the marked build's file", got)
		}
	})

	t.Run("refused attribute", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
		defer cancel()
		if _, err := e.CreatePod(ctx, e.csiPod("typo", csiVolume("typo", "comit", "always"), "true")); err != nil {
			t.Fatal(err)
		}
		ev := e.waitEvent(ctx, e.Namespace, "Pod", "typo", func(ev *corev1.Event) bool { return ev.Reason == "InvalidVolumeAttributes" })
		if !strings.Contains(ev.Message, `"comit"`) || !strings.Contains(ev.Message, "cache (required), mode, commit") {
			t.Errorf("the refusal %q does not name the attribute and the valid ones", ev.Message)
		}
		// The kubelet tells the user too, and the pod does not start.
		mount := e.waitEvent(ctx, e.Namespace, "Pod", "typo", func(ev *corev1.Event) bool { return ev.Reason == "FailedMount" })
		if !strings.Contains(mount.Message, `"comit"`) {
			t.Errorf("the kubelet's FailedMount %q does not carry the refusal", mount.Message)
		}
		p, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, "typo", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodPending {
			t.Errorf("pod with a refused volume: %v, phase %s; want Pending", err, phaseOf(p))
		}
	})
	// Issue 33, finding 3: any pod may name the driver, so a namespace
	// gets CSI volumes only once a cluster admin labels it (the
	// framework labels the test namespaces; this one's label goes).
	t.Run("namespace not opted in", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
		defer cancel()
		patch := []byte(`{"metadata":{"labels":{"` + v1alpha1.LabelCSI + `":null}}}`)
		if _, err := e.Client.CoreV1().Namespaces().Patch(ctx, e.Namespace, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.CreatePod(ctx, e.csiPod("unlabeled", csiVolume("maven"), "true")); err != nil {
			t.Fatal(err)
		}
		ev := e.waitEvent(ctx, e.Namespace, "Pod", "unlabeled", func(ev *corev1.Event) bool { return ev.Reason == "CSINotEnabled" })
		if want := "kubectl label namespace " + e.Namespace + " " + v1alpha1.LabelCSI + "=" + v1alpha1.CSIEnabled; !strings.Contains(ev.Message, want) {
			t.Errorf("the refusal %q does not say how to opt in (%q)", ev.Message, want)
		}
		p, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, "unlabeled", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodPending {
			t.Errorf("pod of a namespace not opted in: %v, phase %s; want Pending", err, phaseOf(p))
		}
	})

	t.Run("claim and CSI at once", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
		defer cancel()
		const cacheName = "mixed"
		hold := " && until [ -e /tmp/go ]; do sleep 1; done"
		claimPod := e.cachePod("by-claim", cacheAnnotations(cacheName), "echo claim > /cache/claim"+hold)
		csiPod := e.csiPod("by-csi", csiVolume(cacheName), "echo csi > /cache/csi"+hold)
		for _, p := range []*corev1.Pod{claimPod, csiPod} {
			if _, err := e.CreatePod(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{"by-claim", "by-csi"} {
			if _, err := e.WaitForPodPhase(ctx, p, corev1.PodRunning); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{"by-claim", "by-csi"} {
			e.exec(ctx, p, "touch /tmp/go")
		}
		for _, p := range []string{"by-claim", "by-csi"} {
			if _, err := e.WaitForPodPhase(ctx, p, corev1.PodSucceeded); err != nil {
				t.Fatal(err)
			}
		}
		e.expectVolumeEnd(ctx, "by-claim", "Committed")
		e.expectCSIEnd(ctx, "by-csi", "Committed")
		e.waitGeneration(ctx, cacheName, 2)
		check := e.runPod(ctx, e.csiPod("check", csiVolume(cacheName), "ls -1A /cache"), corev1.PodSucceeded)
		if got := lines(e.logs(ctx, check.Name)); !slices.Equal(got, []string{"claim", "csi"}) {
			t.Errorf("the cache holds %q, want both builds' files", got)
		}
	})
}
