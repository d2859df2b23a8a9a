//go:build e2e && multinode

package multinode

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// csiPod runs script on node with cache at /cache, from a CSI inline
// volume of the registry's class (volumeAttributes storageClass). The
// framework's namespaces are opted in to CSI volumes (v1alpha1.LabelCSI).
func (e *syncEnv) csiPod(name, node, cache, script string) *corev1.Pod {
	pod := framework.BusyboxPod(name, "sh", "-c", "set -e; "+script)
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	pod.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
		CSI: &corev1.CSIVolumeSource{Driver: v1alpha1.CSIDriverName, VolumeAttributes: map[string]string{
			v1alpha1.CSIAttributeCache: cache, v1alpha1.CSIAttributeStorageClass: e.Reg.StorageClass,
		}},
	}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: mountPath}}
	return pod
}

// expectCommitted waits for the end of pod's CSI volume and checks that
// it was committed.
func (e *syncEnv) expectCommitted(ctx context.Context, pod string) {
	e.t.Helper()
	if reason, msg := e.CSIVolumeEnd(ctx, pod); reason != "Committed" {
		e.t.Fatalf("the CSI volume of pod %s ended %s (%q), want Committed", pod, reason, msg)
	}
}

// TestCSIVolumesFollowTheirBuilds (issue 36): a CSI inline volume that
// names a registry class syncs as a claim of that class does. A CSI pod
// on node A writes, a CSI pod on node B sees it and writes, and a claim
// pod of the same cache on node A sees both: CSI volumes and claims share
// one chain.
func TestCSIVolumesFollowTheirBuilds(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)

	e.run(ctx, e.csiPod("csi-a", a, "gradle", "echo 'from A' > /cache/a.txt"))
	e.expectCommitted(ctx, "csi-a")
	pub := e.waitPublished(ctx, "gradle", 1).Status.Published
	if want := e.Reg.Repository + "/" + e.Namespace + "/gradle"; pub.Repository != want || pub.Layers[0].Node != a {
		t.Errorf("published chain %+v: want repository %s and the layer from %s", pub, want, a)
	}

	out := e.run(ctx, e.csiPod("csi-b", b, "gradle", "cat /cache/a.txt; echo 'from B' > /cache/b.txt"))
	if strings.TrimSpace(out) != "from A" {
		t.Fatalf("the CSI pod on %s read %q, want A's file", b, out)
	}
	e.expectCommitted(ctx, "csi-b")
	pub = e.waitPublished(ctx, "gradle", 2).Status.Published
	if len(pub.Layers) != 2 || pub.Layers[0].Node != b {
		t.Errorf("published chain %+v: want %s's layer on %s's", pub, b, a)
	}

	out = e.run(ctx, e.buildPod("claim-a", a, "gradle", "", "cat /cache/a.txt /cache/b.txt"))
	if got := strings.Fields(out); len(got) != 4 || strings.Join(got, " ") != "from A from B" {
		t.Fatalf("the claim pod on %s read %q, want both CSI pods' files", a, out)
	}
}
