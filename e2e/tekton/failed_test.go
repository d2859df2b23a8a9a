//go:build e2e

package tekton

import (
	"context"
	"testing"
	"time"
)

// writePipeline writes into its cache workspace, then a second Task checks
// that it sees the write and exits with the parameter exit.
const writePipeline = `
apiVersion: tekton.dev/v1
kind: Pipeline
metadata:
  name: write
spec:
  params:
  - name: exit
    default: "0"
  workspaces:
  - name: cache
  tasks:
  - name: write
    workspaces: [{name: cache, workspace: cache}]
    taskSpec:
      workspaces: [{name: cache}]
      steps:
      - name: write
        image: ` + busyboxImage + `
        script: |
          set -eu
          echo "$(context.pipelineRun.name)" > $(workspaces.cache.path)/written-by
  - name: check
    runAfter: [write]
    params: [{name: exit, value: $(params.exit)}]
    workspaces: [{name: cache, workspace: cache}]
    taskSpec:
      params: [{name: exit}]
      workspaces: [{name: cache}]
      steps:
      - name: check
        image: ` + busyboxImage + `
        script: |
          set -eu
          test "$(cat $(workspaces.cache.path)/written-by)" = "$(context.pipelineRun.name)"
          exit $(params.exit)
`

// writeRun runs writePipeline as the build user on the scenario's node.
// Arguments: name, exit status of the check Task, node, cache.
const writeRun = `
apiVersion: tekton.dev/v1
kind: PipelineRun
metadata:
  name: %s
spec:
  pipelineRef: {name: write}
  params: [{name: exit, value: "%d"}]
  taskRunTemplate:
    podTemplate:
      securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
      nodeSelector: {kubernetes.io/hostname: %s}
  workspaces:
  - name: cache
%s
`

// TestFailedPipelineRunDoesNotCommit: a PipelineRun whose second Task fails
// leaves the cache as it was when its claim goes with it.
func TestFailedPipelineRunDoesNotCommit(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e.create(ctx, pipelinesGVR, e.object(writePipeline))
	const cache = "failing"

	e.create(ctx, pipelineRunsGVR, e.object(writeRun, "failed", 1, e.Node.Name, cacheTemplate(cache)))
	r := e.waitRun(ctx, pipelineRunsGVR, "failed")
	if r.Succeeded {
		t.Fatalf("PipelineRun failed succeeded; its check Task exits 1")
	}
	t.Logf("PipelineRun failed: %s", r.Reason)
	claim := e.claimOf(ctx, r.Obj)
	e.deleteRun(ctx, pipelineRunsGVR, "failed")
	reason, msg := e.VolumeEnd(ctx, claim.Name, claim.Spec.VolumeName)
	if reason != "Discarded" {
		t.Errorf("volume of the failed PipelineRun: %s (%s), want Discarded", reason, msg)
	}
	t.Logf("volume of the failed PipelineRun: %s: %s", reason, msg)
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 0 {
		t.Errorf("cache %s is at generation %d after a failed PipelineRun, want 0", cache, g)
	}
}
