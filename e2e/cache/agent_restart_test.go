//go:build e2e

package cache

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// agentRestartTimeout bounds the node agent's restart: the DaemonSet
// replaces the pod, the agent recovers its store and syncs its informers.
const agentRestartTimeout = 3 * time.Minute

// kubeletRetryMax is the longest the kubelet waits before it retries a
// failed volume operation (2m2s, its exponential backoff's cap).
const kubeletRetryMax = 2*time.Minute + 2*time.Second

// TestNodeAgentRestart takes the node agent away under a cache's pods, in
// two ways. First its pod is deleted while a pod uses a volume: the volume
// keeps working through the restart. Then the agent is kept off the node
// while a pod ends (the commit waits: nothing else may end the volume) and
// a new pod asks for a volume (the claim waits), and two pods end and are
// deleted at once, as CI systems do. Nothing is lost: the deleted pods
// stay in the API, Terminating, because the kubelet cannot unpublish their
// volumes without the agent; once the agent is back, it sees the pods that
// ended while it was away and commits their volumes (claims' and CSI
// volumes, whose unpublish the kubelet retried while the driver was
// gone), the deleted pods go, the new claim completes, the running pod
// still reads and writes its volume, and the next pod sees every pod's
// files.
//
// A DaemonSet replaces a deleted pod within a second or two, so deleting
// the pod alone cannot hold a commit back; the second phase keeps the
// agent off the node with node affinity on the DaemonSet until it has
// seen the commit wait.
//
// It does not run in parallel with the other scenarios: they would see the
// agent go away under them.
func TestNodeAgentRestart(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "restart"
	hold := "until [ -e /tmp/go ]; do sleep 1; done"

	for _, pod := range []*corev1.Pod{
		e.cachePod("long", cacheAnnotations(cacheName), "echo before > /cache/long-before && "+hold),
		e.cachePod("short", cacheAnnotations(cacheName), "echo short > /cache/short && "+hold),
		e.csiPod("csi-short", csiVolume(cacheName), "echo csi > /cache/csi-short && "+hold),
		e.cachePod("deleted", cacheAnnotations(cacheName), "echo deleted > /cache/deleted && "+hold),
		e.csiPod("csi-deleted", csiVolume(cacheName), "echo csi-deleted > /cache/csi-deleted && "+hold),
	} {
		if _, err := e.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	for _, pod := range []string{"long", "short", "csi-short", "deleted", "csi-deleted"} {
		if _, err := e.WaitForPodPhase(ctx, pod, corev1.PodRunning); err != nil {
			t.Fatal(err)
		}
	}

	// Phase 1: the agent's pod is deleted while volumes are mounted.
	agent := e.agentPod(ctx)
	t.Logf("deleting node agent pod %s", agent.Name)
	if err := e.Client.CoreV1().Pods(agent.Namespace).Delete(ctx, agent.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting node agent pod %s: %v", agent.Name, err)
	}
	agent = e.waitAgentReady(ctx, string(agent.UID), agentRestartTimeout)
	t.Logf("node agent pod %s is ready", agent.Name)
	if got := e.exec(ctx, "long", "cat /cache/long-before && echo after > /cache/long-after && cat /cache/long-after"); got != "before\nafter\n" {
		t.Errorf("the running pod's volume after the agent's restart reads %q, want %q", got, "before\nafter\n")
	}
	if got := e.exec(ctx, "csi-short", "echo kept > /cache/csi-kept && cat /cache/csi-short /cache/csi-kept"); got != "csi\nkept\n" {
		t.Errorf("the running pod's CSI volume after the agent's restart reads %q, want %q", got, "csi\nkept\n")
	}

	// Phase 2: no agent on the node while a pod ends and a new one starts.
	restore := e.keepAgentOff(ctx)
	// The pods end with no agent on the node: the kubelet's unpublish of
	// the CSI volume fails until the agent is back.
	for _, pod := range []string{"short", "csi-short", "deleted", "csi-deleted"} {
		e.exec(ctx, pod, "touch /tmp/go")
		if _, err := e.WaitForPodPhase(ctx, pod, corev1.PodSucceeded); err != nil {
			t.Fatal(err)
		}
	}
	for _, pod := range []string{"deleted", "csi-deleted"} {
		if err := e.Client.CoreV1().Pods(e.Namespace).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.CreatePod(ctx, e.cachePod("late", cacheAnnotations(cacheName), "echo late > /cache/late")); err != nil {
		t.Fatal(err)
	}
	e.waitSelectedNode(ctx, "late")
	// Give a (wrongly) surviving agent, or the manager, time to act before
	// checking that the commit and the claim really wait.
	time.Sleep(3 * time.Second)
	if pv, deleted := e.pvs.get(claimName("short")); deleted || pv.Status.Phase != corev1.VolumeBound || pv.Annotations[v1alpha1.AnnotationResult] != "" {
		t.Fatalf("with no node agent, the volume of the ended pod was handled (deleted %v, phase %s, annotations %v); want it Bound and waiting", deleted, pv.Status.Phase, pv.Annotations)
	}
	e.expectNoVolume(ctx, "late")
	for _, name := range []string{"deleted", "csi-deleted"} {
		pod, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s, deleted after it ended with no node agent on the node: %v; want it kept Terminating until its volume has ended", name, err)
		}
		if pod.DeletionTimestamp == nil {
			t.Fatalf("pod %s has no deletion timestamp after its deletion", name)
		}
	}
	if c, err := e.cache(ctx, cacheName); err != nil || c.Status.Generation != 0 {
		t.Fatalf("with no node agent, cache %s: %v, %s; want generation 0 (nothing may end the volumes)", cacheName, err, statusString(c))
	}
	if got := e.exec(ctx, "long", "cat /cache/long-after && echo away > /cache/long-away && cat /cache/long-away"); got != "after\naway\n" {
		t.Errorf("the running pod's volume without an agent reads %q, want %q", got, "after\naway\n")
	}
	restore()
	t.Logf("node agent pod %s is ready", e.agentPod(ctx).Name)

	// A CSI volume ends when the kubelet unpublishes it, and the kubelet
	// retries the unpublish that failed while the agent was away with a
	// backoff that doubles up to kubeletRetryMax: the agent's return may
	// fall just after a retry.
	e.expectVolumeEnd(ctx, "short", "Committed")
	e.expectCSIEndWithin(ctx, kubeletRetryMax+eventTimeout, "csi-short", "Committed")
	e.expectVolumeEnd(ctx, "deleted", "Committed")
	e.expectCSIEndWithin(ctx, kubeletRetryMax+eventTimeout, "csi-deleted", "Committed")
	for _, pod := range []string{"deleted", "csi-deleted"} {
		e.waitPodGone(ctx, pod)
	}
	if _, err := e.WaitForPodPhase(ctx, "late", corev1.PodSucceeded); err != nil {
		t.Fatal(err)
	}
	e.expectVolumeEnd(ctx, "late", "Committed")

	e.exec(ctx, "long", "touch /tmp/go")
	if _, err := e.WaitForPodPhase(ctx, "long", corev1.PodSucceeded); err != nil {
		t.Fatal(err)
	}
	end := e.expectVolumeEnd(ctx, "long", "Committed")
	checkPVAnnotations(t, end.PV, map[string]string{v1alpha1.AnnotationBaseGeneration: "0"})
	e.waitGeneration(ctx, cacheName, 6)

	e.runPod(ctx, e.cachePod("check", cacheAnnotations(cacheName), "ls -1A /cache"), corev1.PodSucceeded)
	want := []string{"csi-deleted", "csi-kept", "csi-short", "deleted", "late", "long-after", "long-away", "long-before", "short"}
	if got := lines(e.logs(ctx, "check")); !slices.Equal(got, want) {
		t.Errorf("after the agent's restarts the cache holds %q, want %q", got, want)
	}
}

// waitPodGone waits until pod is gone from the API server: a deleted pod
// whose volumes the kubelet could not unpublish stays Terminating.
func (e *env) waitPodGone(ctx context.Context, pod string) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(ctx, pollInterval, volumeTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		e.t.Fatalf("deleted pod %s is still in the API after %s: %v", pod, volumeTimeout, err)
	}
}

// keepAgentOff gives the node agent's DaemonSet a node affinity that
// excludes the scenario's node, and waits until the agent's pod there is
// gone. The returned function (also run at cleanup, and safe to call
// twice) removes the affinity and waits until the agent is ready again.
func (e *env) keepAgentOff(ctx context.Context) (restore func()) {
	e.t.Helper()
	dsets := e.Client.AppsV1().DaemonSets(framework.SystemNamespace)
	list, err := dsets.List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=layercache,app.kubernetes.io/component=node"})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(list.Items) != 1 {
		e.t.Fatalf("%d node agent DaemonSets in %s, want 1", len(list.Items), framework.SystemNamespace)
	}
	ds := list.Items[0]
	if ds.Spec.Template.Spec.Affinity != nil {
		e.t.Fatalf("DaemonSet %s already has an affinity (%+v); this scenario needs one of its own to keep the agent off node %s", ds.Name, ds.Spec.Template.Spec.Affinity, e.Node.Name)
	}
	old := e.agentPod(ctx)
	affinity := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{e.Node.Name},
			}},
		}}},
	}}
	add, err := json.Marshal([]map[string]any{{"op": "add", "path": "/spec/template/spec/affinity", "value": affinity}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.patchDaemonSet(ctx, &ds, add)
	restored := false
	restore = func() {
		if restored {
			return
		}
		restored = true
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), agentRestartTimeout)
		defer cancel()
		e.patchDaemonSet(ctx, &ds, []byte(`[{"op":"remove","path":"/spec/template/spec/affinity"}]`))
		e.waitAgentReady(ctx, string(old.UID), agentRestartTimeout)
	}
	e.t.Cleanup(restore)

	err = wait.PollUntilContextTimeout(ctx, pollInterval, agentRestartTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := e.agentPods(ctx)
		return len(pods) == 0, err
	})
	if err != nil {
		e.t.Fatalf("the node agent's pod %s stayed on node %s after DaemonSet %s excluded the node: %v", old.Name, e.Node.Name, ds.Name, err)
	}
	e.t.Logf("node agent kept off node %s", e.Node.Name)
	return restore
}

func (e *env) patchDaemonSet(ctx context.Context, ds *appsv1.DaemonSet, patch []byte) {
	e.t.Helper()
	_, err := e.Client.AppsV1().DaemonSets(ds.Namespace).Patch(ctx, ds.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if err != nil {
		e.t.Fatalf("patching DaemonSet %s/%s with %s: %v (if the agent stays away, remove the affinity: kubectl -n %s patch daemonset %s --type json -p '[{\"op\":\"remove\",\"path\":\"/spec/template/spec/affinity\"}]')",
			ds.Namespace, ds.Name, patch, err, ds.Namespace, ds.Name)
	}
}

// waitSelectedNode waits until the scheduler has picked the scenario's node
// for the claim of pod: from then on only the node agent can act on it.
func (e *env) waitSelectedNode(ctx context.Context, pod string) {
	e.t.Helper()
	claims := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace)
	err := wait.PollUntilContextTimeout(ctx, pollInterval, framework.PodStartTimeout, true, func(ctx context.Context) (bool, error) {
		pvc, err := claims.Get(ctx, claimName(pod), metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return false, err
		}
		return pvc.Annotations["volume.kubernetes.io/selected-node"] == e.Node.Name, nil
	})
	if err != nil {
		e.t.Fatalf("the scheduler did not select node %s for claim %s: %v", e.Node.Name, claimName(pod), err)
	}
}
