//go:build e2e

package argo

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// writeWorkflow writes into its cache volume, then a second step checks
// that it sees the write and exits with the parameter exit. Arguments:
// name, exit status of the check step, node.
const writeWorkflow = `
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  name: %s
spec:
  entrypoint: main
  serviceAccountName: ` + serviceAccount + `
  arguments:
    parameters: [{name: exit, value: "%d"}]
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  nodeSelector: {kubernetes.io/hostname: %s}
  templates:
  - name: main
    steps:
    - - {name: write, template: write}
    - - {name: check, template: check}
  - name: write
    container:
      image: ` + framework.ImageBusybox + `
      command: [sh, -c, 'echo "{{workflow.name}}" > /cache/written-by']
      volumeMounts: [{name: cache, mountPath: /cache}]
  - name: check
    container:
      image: ` + framework.ImageBusybox + `
      command: [sh, -c, 'test "$(cat /cache/written-by)" = "{{workflow.name}}" && exit {{workflow.parameters.exit}}']
      volumeMounts: [{name: cache, mountPath: /cache}]
`

// TestFailedWorkflowCommitsNothing: a Workflow whose second step fails,
// under Argo's default volumeClaimGC (OnWorkflowSuccess). Argo keeps a
// failed Workflow's claim ("to reuse them for retried failed/error
// workflows", operator.go deletePVCs) until the Workflow is deleted, so
// the build has not ended and nothing is committed while the Workflow
// stays; deleting it (by hand, or Argo's ttlStrategy) garbage-collects the
// claim, and layercache discards the volume: a pod of its last attempt
// failed. The cache stays at generation 0 throughout.
func TestFailedWorkflowCommitsNothing(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	pvs := e.WatchPVs(ctx)
	const cache = "failing"

	w := e.run(ctx, e.writeWorkflow("failed", 1, cacheClaimTemplate(cache)))
	if w.Phase != "Failed" {
		t.Fatalf("Workflow failed is %s, want Failed: its check step exits 1", w.Phase)
	}
	claim := claimName("failed", "cache")
	pv := pvs.Wait(ctx, t, claim)

	// Argo keeps the claim: the build has not ended.
	e.settleFor(ctx, 10*time.Second)
	c := e.claim(ctx, claim)
	if c == nil || c.DeletionTimestamp != nil {
		t.Fatalf("claim %s of the failed Workflow is gone or being deleted 10s after it failed (%v); Argo's default volumeClaimGC keeps it", claim, c)
	}
	if r := pvs.Last(pv.Name).Annotations[v1alpha1.AnnotationResult]; r != "" {
		t.Errorf("PV %s of the kept claim already has %s=%q", pv.Name, v1alpha1.AnnotationResult, r)
	}
	// The manager records the outcome so far as each pod of the claim
	// ends, so the PV says failed before anything deletes the claim.
	e.expectPodOutcome(pvs, pv.Name, v1alpha1.OutcomeFailed)
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 0 {
		t.Errorf("cache %s is at generation %d while the failed Workflow keeps its claim, want 0", cache, g)
	}
	t.Logf("failed Workflow: claim %s kept (owner %s), nothing committed", claim, c.OwnerReferences[0].Kind+"/"+c.OwnerReferences[0].Name)

	// Deleting the Workflow ends the build: discarded.
	e.deleteWorkflow(ctx, "failed")
	reason, msg := e.VolumeEnd(ctx, claim, pv.Name)
	if reason != "Discarded" {
		t.Errorf("volume of the failed Workflow: %s (%s), want Discarded", reason, msg)
	}
	t.Logf("volume of the failed Workflow after its deletion: %s: %s", reason, msg)
	e.waitClaimGone(ctx, claim)
	// The garbage collector deletes the Workflow's pods and its claim at
	// once; the failed pod may leave the manager's cache before the
	// succeeded one, and the manager once rewrote the PV to succeeded then
	// (seen once in three runs). Only a newer attempt turns a recorded
	// failure into a success now, so a node agent that restarted and read
	// the PV would discard too.
	if got := pvs.Last(pv.Name).Annotations[v1alpha1.AnnotationPodOutcome]; got != v1alpha1.OutcomeFailed {
		t.Errorf("PV %s says %s=%q after the failed Workflow's deletion, want %q", pv.Name, v1alpha1.AnnotationPodOutcome, got, v1alpha1.OutcomeFailed)
	}
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 0 {
		t.Errorf("cache %s is at generation %d after a failed Workflow, want 0", cache, g)
	}
}

// TestFailedWorkflowOnCompletionDiscards: with volumeClaimGC
// OnWorkflowCompletion Argo deletes the claim as soon as the Workflow
// completes, failed or not; a failed Workflow's volume is discarded then,
// without deleting the Workflow.
func TestFailedWorkflowOnCompletionDiscards(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	pvs := e.WatchPVs(ctx)
	const cache = "completion"

	wf := e.writeWorkflow("failed", 1, cacheClaimTemplate(cache))
	if err := unstructured.SetNestedField(wf.Object, "OnWorkflowCompletion", "spec", "volumeClaimGC", "strategy"); err != nil {
		t.Fatal(err)
	}
	w := e.run(ctx, wf)
	if w.Phase != "Failed" {
		t.Fatalf("Workflow failed is %s, want Failed: its check step exits 1", w.Phase)
	}
	claim := claimName("failed", "cache")
	pv := pvs.Wait(ctx, t, claim)
	e.waitClaimGone(ctx, claim)
	reason, msg := e.VolumeEnd(ctx, claim, pv.Name)
	if reason != "Discarded" {
		t.Errorf("volume of the failed Workflow: %s (%s), want Discarded", reason, msg)
	}
	t.Logf("volume of the failed Workflow at its completion: %s: %s", reason, msg)
	e.expectPodOutcome(pvs, pv.Name, v1alpha1.OutcomeFailed)
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 0 {
		t.Errorf("cache %s is at generation %d after a failed Workflow, want 0", cache, g)
	}
}

// writeWorkflow is a writeWorkflow whose volume cache comes from tmpl.
func (e *env) writeWorkflow(name string, exit int, tmpl map[string]any) *unstructured.Unstructured {
	e.t.Helper()
	wf := e.object(writeWorkflow, name, exit, e.Node.Name)
	withClaimTemplate(wf, tmpl)
	return wf
}
