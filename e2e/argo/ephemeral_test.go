//go:build e2e

package argo

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// ephemeralWorkflow is a one-step Workflow whose cache is a generic
// ephemeral volume in the Workflow's volumes: Argo adds it to the pod of
// each step that mounts it, so each pod gets a claim of its own, owned by
// the pod. The step appends the Workflow's name to a log on the cache.
// Arguments: name, node, cache, StorageClass.
const ephemeralWorkflow = `
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  name: %[1]s
spec:
  entrypoint: step
  serviceAccountName: ` + serviceAccount + `
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  volumes:
  - name: cache
    ephemeral:
      volumeClaimTemplate:
        metadata:
          annotations: {` + v1alpha1.AnnotationCache + `: %[3]s}
        spec:
          storageClassName: %[4]s
          accessModes: [ReadWriteOnce]
          resources: {requests: {storage: 1Gi}}
  templates:
  - name: step
    container:
      image: ` + framework.ImageBusybox + `
      command: [sh, -c, 'echo "{{workflow.name}}" >> /cache/log && cat /cache/log']
      volumeMounts: [{name: cache, mountPath: /cache}]
`

// TestWorkflowEphemeralVolumeCache: a cache per step rather than per
// Workflow. The claim of a generic ephemeral volume belongs to the step's
// pod, so the node agent commits it as soon as the pod has ended, and
// records the result on the PV; volumeClaimGC has nothing to do with it.
// The second Workflow's step sees the first's write.
func TestWorkflowEphemeralVolumeCache(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	pvs := e.WatchPVs(ctx)
	const cache = "per-step"

	for i, name := range []string{"first", "second"} {
		w := e.run(ctx, e.object(ephemeralWorkflow, name, e.Node.Name, cache, storageClass))
		if !w.Succeeded() {
			t.Fatalf("Workflow %s: %s %s", name, w.Phase, w.Message)
		}
		pod := e.stepPod(ctx, name)
		claim := pod + "-cache" // ephemeral.VolumeClaimName
		pv := pvs.Wait(ctx, t, claim)
		if reason, msg := e.VolumeEnd(ctx, claim, pv.Name); reason != "Committed" {
			t.Fatalf("volume of Workflow %s: %s (%s), want Committed", name, reason, msg)
		}
		err := waitFor(ctx, func() bool {
			last := pvs.Last(pv.Name)
			return last.Annotations[v1alpha1.AnnotationResult] == v1alpha1.ResultCommitted &&
				last.Annotations[v1alpha1.AnnotationCommittedGeneration] == fmt.Sprint(i+1)
		})
		if err != nil {
			t.Errorf("PV %s of the pod-owned claim: annotations %v, want %s=%s and %s=%d", pv.Name, pvs.Last(pv.Name).Annotations,
				v1alpha1.AnnotationResult, v1alpha1.ResultCommitted, v1alpha1.AnnotationCommittedGeneration, i+1)
		}
		if g := e.CacheGeneration(ctx, e.Node, cache); g != i+1 {
			t.Errorf("cache %s is at generation %d after Workflow %s, want %d", cache, g, name, i+1)
		}
	}
	logs, err := e.PodLogs(ctx, e.stepPod(ctx, "second"), "main")
	if err != nil {
		t.Fatal(err)
	}
	// Argo's emissary logs its own lines after the step's output.
	if !strings.HasPrefix(logs, "first\nsecond\n") {
		t.Errorf("the second Workflow's step read %q from the cache, want the first's line and its own", logs)
	}
}

// stepPod returns the name of the one pod of the Workflow name.
func (e *env) stepPod(ctx context.Context, workflow string) string {
	e.t.Helper()
	pods, err := e.Client.CoreV1().Pods(e.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "workflows.argoproj.io/workflow=" + workflow})
	if err != nil || len(pods.Items) != 1 {
		e.t.Fatalf("the pods of Workflow %s: %v (%d pods), want one", workflow, err, len(pods.Items))
	}
	return pods.Items[0].Name
}
