//go:build e2e

package argo

import (
	"context"
	"testing"
	"time"

	"github.com/layercache/layercache/api/v1alpha1"
)

// completedWatch is how long the quiet scenarios watch a namespace whose
// completed Workflow and pods stay. Each runs one small Workflow, then
// waits about five minutes, so they run side by side, and beside
// TestWorkflowWarmCache, once the package's other scenarios are done
// (Go's t.Parallel). The Go builds stay one at a time: two at once on 2
// cores timed out beside e2e/cache.
const completedWatch = 3 * time.Minute

// TestCompletedWorkflowIsQuiet: once a successful Workflow's claim is
// committed and gone, with the Workflow and its pods kept (Argo's default:
// no podGC, no TTL), nothing writes to the namespace: no controller of
// Argo's or layercache's undoes the other's work (a claim recreated, a
// PV re-annotated, Events repeated).
func TestCompletedWorkflowIsQuiet(t *testing.T) {
	t.Parallel() // a wait, beside the others: see completedWatch
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), completedWatch+10*time.Minute)
	defer cancel()
	pvs := e.WatchPVs(ctx)
	const cache = "quiet"

	w := e.run(ctx, e.writeWorkflow("ok", 0, cacheClaimTemplate(cache)))
	if !w.Succeeded() {
		t.Fatalf("Workflow ok: %s %s", w.Phase, w.Message)
	}
	claim := claimName("ok", "cache")
	pv := pvs.Wait(ctx, t, claim)
	if reason, msg := e.VolumeEnd(ctx, claim, pv.Name); reason != "Committed" {
		t.Fatalf("volume of Workflow ok: %s (%s), want Committed", reason, msg)
	}
	e.waitClaimGone(ctx, claim)
	e.ExpectQuiet(ctx, 2*time.Minute, completedWatch, workflowsGVR, workflowTaskResultsGVR)
}

// TestKeptFailedWorkflowIsQuiet: a failed Workflow stays, with its pods
// and (Argo's default volumeClaimGC) its claim. The manager has recorded
// the failure on the PV; nothing may rewrite it or anything else in the
// namespace while the Workflow is kept, and nothing is committed.
func TestKeptFailedWorkflowIsQuiet(t *testing.T) {
	t.Parallel() // a wait, beside the others: see completedWatch
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), completedWatch+10*time.Minute)
	defer cancel()
	pvs := e.WatchPVs(ctx)
	const cache = "kept-failed"

	w := e.run(ctx, e.writeWorkflow("kept-failed", 1, cacheClaimTemplate(cache)))
	if w.Phase != "Failed" {
		t.Fatalf("Workflow kept-failed is %s, want Failed: its check step exits 1", w.Phase)
	}
	pv := pvs.Wait(ctx, t, claimName("kept-failed", "cache"))
	e.expectPodOutcome(pvs, pv.Name, v1alpha1.OutcomeFailed)
	e.ExpectQuiet(ctx, 2*time.Minute, completedWatch, workflowsGVR, workflowTaskResultsGVR)
	if got := pvs.Last(pv.Name).Annotations[v1alpha1.AnnotationPodOutcome]; got != v1alpha1.OutcomeFailed {
		t.Errorf("PV %s says %s=%q while the failed Workflow is kept, want %q", pv.Name, v1alpha1.AnnotationPodOutcome, got, v1alpha1.OutcomeFailed)
	}
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 0 {
		t.Errorf("cache %s is at generation %d while the failed Workflow is kept, want 0", cache, g)
	}
}
