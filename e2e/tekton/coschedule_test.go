//go:build e2e

package tekton

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

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

	pvs := e.watchPVs(ctx)
	e.create(ctx, pipelineRunsGVR, e.object(writeRun, "ok", 0, e.Node.Name, cacheTemplate(cache)))
	r := e.waitRun(ctx, pipelineRunsGVR, "ok")
	if !r.Succeeded {
		t.Fatalf("PipelineRun ok: %s", r.Reason)
	}
	done := time.Now()
	pv := pvs.wait(ctx, t)
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

	reason, msg := e.volumeEnd(ctx, pv.Spec.ClaimRef.Name, pv.Name)
	last := pvs.last()
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

// pvWatch remembers the last state of the layercache PV of the scenario's
// namespace, even after it is deleted.
type pvWatch struct {
	mu sync.Mutex
	pv *corev1.PersistentVolume
}

func (e *env) watchPVs(ctx context.Context) *pvWatch {
	e.t.Helper()
	w := &pvWatch{}
	// An informer, not a bare watch: it lists first and re-watches when
	// the API server closes the stream.
	factory := informers.NewSharedInformerFactoryWithOptions(e.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.AnnotationNode }))
	record := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		pv, ok := obj.(*corev1.PersistentVolume)
		if !ok || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != e.Namespace {
			return
		}
		w.mu.Lock()
		w.pv = pv.DeepCopy()
		w.mu.Unlock()
	}
	informer := factory.Core().V1().PersistentVolumes().Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) }, DeleteFunc: record,
	}); err != nil {
		e.t.Fatal(err)
	}
	stop := make(chan struct{})
	e.t.Cleanup(func() { close(stop) })
	factory.Start(stop)
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			e.t.Fatalf("syncing the %v informer failed", typ)
		}
	}
	return w
}

func (w *pvWatch) last() *corev1.PersistentVolume {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pv
}

func (w *pvWatch) wait(ctx context.Context, t *testing.T) *corev1.PersistentVolume {
	t.Helper()
	var pv *corev1.PersistentVolume
	err := wait.PollUntilContextTimeout(ctx, pollInterval, volumeTimeout, true, func(context.Context) (bool, error) {
		pv = w.last()
		return pv != nil, nil
	})
	if err != nil {
		t.Fatalf("no layercache PV for the namespace's claims: %v", err)
	}
	return pv
}
