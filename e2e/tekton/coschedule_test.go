//go:build e2e

package tekton

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestCoschedulePipelineRunsCommitsWorkspace is the regression test of a
// bug this package found: under Tekton's coschedule modes "pipelineruns"
// and "isolate-pipelinerun" a successful PipelineRun's workspace was
// discarded instead of committed.
//
// In those modes Tekton v1.6.0 creates the workspace claim through the
// affinity assistant StatefulSet's volumeClaimTemplates (no owner), and at
// the PipelineRun's completion deletes the StatefulSet and the claim at
// once, lifting kubernetes.io/pvc-protection itself
// (pkg/reconciler/pipelinerun/affinity_assistant.go
// cleanupAffinityAssistantsAndPVCs -> pkg/reconciler/volumeclaim/
// pvchandler.go PurgeFinalizerAndDeletePVCForWorkspace). The affinity
// assistant pod, which mounts the claim, was still running then, so the
// claim went before the manager recorded the pods' outcome on the PV, and
// the node agent ended the released volume with an unknown outcome, which
// on-success discards. The manager's finalizer layercache.dev/outcome now
// holds the claim until every pod has ended and the outcome is recorded.
//
// The test switches Tekton's feature flag for its duration (the scenarios
// of this package run one after the other) and expects what a user
// expects: the successful PipelineRun's work is committed.
func TestCoschedulePipelineRunsCommitsWorkspace(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e.setCoschedule(ctx, "pipelineruns")
	e.create(ctx, pipelinesGVR, e.object(writePipeline))
	const cache = "coscheduled"

	pvs := e.WatchPVs(ctx)
	e.create(ctx, pipelineRunsGVR, e.object(writeRun, "ok", 0, e.Node.Name, cacheTemplate(cache)))
	r := e.waitRun(ctx, pipelineRunsGVR, "ok")
	if !r.Succeeded {
		t.Fatalf("PipelineRun ok: %s", r.Reason)
	}
	done := time.Now()
	pv := pvs.Wait(ctx, t, "")
	t.Logf("workspace claim %s (made by the affinity assistant's StatefulSet), volume %s", pv.Spec.ClaimRef.Name, pv.Name)

	// Tekton deletes the claim at completion, without waiting for the
	// PipelineRun's deletion.
	err := wait.PollUntilContextTimeout(ctx, pollInterval, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).Get(ctx, pv.Spec.ClaimRef.Name, metav1.GetOptions{})
		return err != nil, nil
	})
	if err != nil {
		t.Fatalf("Tekton did not delete the workspace claim %s at completion", pv.Spec.ClaimRef.Name)
	}
	t.Logf("workspace claim gone %s after the PipelineRun completed; the PipelineRun still exists", time.Since(done).Round(100*time.Millisecond))

	reason, msg := e.VolumeEnd(ctx, pv.Spec.ClaimRef.Name, pv.Name)
	last := pvs.Last(pv.Name)
	t.Logf("volume %s: %s: %s; last PV annotations %s=%q %s=%q", pv.Name, reason, msg,
		v1alpha1.AnnotationPodOutcome, last.Annotations[v1alpha1.AnnotationPodOutcome],
		v1alpha1.AnnotationResult, last.Annotations[v1alpha1.AnnotationResult])
	if reason != "Committed" {
		t.Errorf("the successful PipelineRun's workspace was %s (%s), want Committed: Tekton deleted the claim while "+
			"its affinity assistant pod still ran, so no pod outcome was recorded on the PV (see this test's comment)", reason, msg)
	}
}

// setCoschedule sets Tekton's coschedule feature flag for the test and
// puts the old value back afterwards.
func (e *env) setCoschedule(ctx context.Context, mode string) {
	e.t.Helper()
	cms := e.Client.CoreV1().ConfigMaps("tekton-pipelines")
	cm, err := cms.Get(ctx, "feature-flags", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	old := cm.Data["coschedule"]
	patch := func(ctx context.Context, v string) error {
		_, err := cms.Patch(ctx, "feature-flags", types.MergePatchType, []byte(`{"data":{"coschedule":"`+v+`"}}`), metav1.PatchOptions{})
		return err
	}
	if err := patch(ctx, mode); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := patch(ctx, old); err != nil {
			e.t.Errorf("restoring Tekton's coschedule flag to %q: %v", old, err)
		}
	})
	// The controller watches its ConfigMaps; give it a moment.
	time.Sleep(2 * time.Second)
}
