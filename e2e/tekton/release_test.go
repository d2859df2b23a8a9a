//go:build e2e

package tekton

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestPipelineRunReleaseOnPodExit: with layercache.dev/release: on-pod-exit
// on the volumeClaimTemplate, the workspace is committed when the
// PipelineRun completes, without deleting it. Under Tekton's default
// coschedule mode the affinity assistant pod holds the claim from before
// the first Task until the PipelineRun completes, so no gap between two
// Tasks releases it early; at completion Tekton deletes the assistant,
// every pod of the claim has ended, and the manager records the outcome
// and deletes the claim.
func TestPipelineRunReleaseOnPodExit(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e.create(ctx, pipelinesGVR, e.object(writePipeline))
	const cache = "released"
	workspace := fmt.Sprintf(`    volumeClaimTemplate:
      metadata:
        annotations:
          %s: %s
          %s: %s
      spec:
        storageClassName: %s
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 1Gi}}`,
		v1alpha1.AnnotationCache, cache, v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit, storageClass)

	e.create(ctx, pipelineRunsGVR, e.object(writeRun, "ok", 0, e.Node.Name, workspace))
	r := e.waitRun(ctx, pipelineRunsGVR, "ok")
	if !r.Succeeded {
		t.Fatalf("PipelineRun ok: %s", r.Reason)
	}
	claim := e.claimOf(ctx, r.Obj)
	reason, msg := e.VolumeEnd(ctx, claim.Name, claim.Spec.VolumeName)
	if reason != "Committed" {
		t.Fatalf("volume of the completed PipelineRun: %s (%s), want Committed", reason, msg)
	}
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 1 {
		t.Errorf("cache %s is at generation %d, want 1", cache, g)
	}
	if _, err := e.Dyn.Resource(pipelineRunsGVR).Namespace(e.Namespace).Get(ctx, "ok", metav1.GetOptions{}); err != nil {
		t.Errorf("the PipelineRun should still exist: %v", err)
	}
	t.Logf("committed at the PipelineRun's completion: %s", msg)
}
