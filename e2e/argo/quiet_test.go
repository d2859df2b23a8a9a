//go:build e2e

package argo

import (
	"context"
	"testing"
	"time"
)

// completedWatch is how long TestCompletedWorkflowIsQuiet watches a
// namespace whose completed Workflow and pods stay.
const completedWatch = 3 * time.Minute

// TestCompletedWorkflowIsQuiet: once a successful Workflow's claim is
// committed and gone, with the Workflow and its pods kept (Argo's default:
// no podGC, no TTL), nothing writes to the namespace: no controller of
// Argo's or layercache's undoes the other's work (a claim recreated, a
// PV re-annotated, Events repeated).
func TestCompletedWorkflowIsQuiet(t *testing.T) {
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
