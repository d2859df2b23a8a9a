//go:build e2e

package argo

import (
	"context"
	"fmt"
	"path"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// goBuildWorkflow checks the source out into the volume cache (from a
// ConfigMap, a stand-in for a git clone), then builds it there in a second
// pod: the build step checks that it sees what checkout wrote in this
// Workflow, and compiles with GOCACHE and GOMODCACHE on the volume. Its
// output parameters (reported by Argo's wait container through the API
// server) are the build's wall time in seconds and the number of files
// GOCACHE held before it. The volume named cache is added by the test: a
// volumeClaimTemplates entry or a hostPath. Arguments: name, fail, node,
// GOROOT and the module download cache on the node.
const goBuildWorkflow = `
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  name: %[1]s
spec:
  entrypoint: main
  serviceAccountName: ` + serviceAccount + `
  arguments:
    parameters: [{name: fail, value: "%[2]t"}]
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  nodeSelector: {kubernetes.io/hostname: %[3]s}
  volumes:
  - name: source
    configMap: {name: hello-src}
  - name: goroot
    hostPath: {path: %[4]s, type: Directory}
  - name: goproxy
    hostPath: {path: %[5]s, type: Directory}
  templates:
  - name: main
    steps:
    - - {name: checkout, template: checkout}
    - - {name: build, template: build}
  - name: checkout
    container:
      image: ` + framework.ImageBusybox + `
      command: [sh, -c]
      args:
      - |
        set -eu
        rm -rf /cache/src
        mkdir -p /cache/src
        cp /source/main.go /source/go.mod /source/go.sum /cache/src/
        echo "{{workflow.name}}" > /cache/src/checked-out-by
      volumeMounts:
      - {name: cache, mountPath: /cache}
      - {name: source, mountPath: /source}
  - name: build
    outputs:
      parameters:
      - name: build-seconds
        valueFrom: {path: /tmp/build-seconds}
      - name: cache-before
        valueFrom: {path: /tmp/cache-before}
    container:
      image: ` + framework.ImageBusybox + `
      command: [sh, -c]
      args:
      - |
        set -eu
        cd /cache/src
        # The checkout step of this very Workflow wrote the source.
        test "$(cat checked-out-by)" = "{{workflow.name}}"
        echo "building as uid $(id -u)"
        find "$GOCACHE" -type f 2>/dev/null | wc -l | tr -d ' \n' > /tmp/cache-before
        start=$(cut -d' ' -f1 /proc/uptime)
        go build -o /tmp/hello .
        end=$(cut -d' ' -f1 /proc/uptime)
        awk -v s="$start" -v e="$end" 'BEGIN { printf "%%.2f", e - s }' > /tmp/build-seconds
        /tmp/hello --name "{{workflow.name}}"
        if [ "{{workflow.parameters.fail}}" = true ]; then
          echo "written by a failed build" > /cache/poison
          exit 1
        fi
      volumeMounts:
      - {name: cache, mountPath: /cache}
      - {name: goroot, mountPath: /usr/local/go, readOnly: true}
      - {name: goproxy, mountPath: /goproxy, readOnly: true}
      env:
      - {name: PATH, value: "/usr/local/go/bin:/bin:/usr/bin"}
      - {name: HOME, value: /tmp}
      - {name: GOCACHE, value: /cache/go-build}
      - {name: GOMODCACHE, value: /cache/go-mod}
      - {name: GOPROXY, value: "file:///goproxy"}
      - {name: GOSUMDB, value: "off"}
      - {name: GOFLAGS, value: "-mod=mod"}
      - {name: GOTOOLCHAIN, value: local}
      - {name: GOTELEMETRY, value: "off"}
      - {name: CGO_ENABLED, value: "0"}
`

// goBuild is one finished run of goBuildWorkflow.
type goBuild struct {
	workflow
	Seconds     time.Duration
	CacheBefore string
}

// TestWorkflowWarmCache: a Workflow's volumeClaimTemplates entry names a
// cache; two steps (pods) in sequence share the claim. Under Argo's default
// volumeClaimGC (OnWorkflowSuccess) the controller deletes a successful
// Workflow's claim as soon as it completes, lifting
// kubernetes.io/pvc-protection itself (operator.go deletePVCs); to
// layercache that ends the standalone claim's build, and its pods
// succeeded, so the volume is committed at the Workflow's completion, with
// the Workflow still there. The next Workflows start warm and commit
// again. The same builds on a hostPath volume give the physical ceiling
// (framework.BuildRuns: in make bench-builds).
func TestWorkflowWarmCache(t *testing.T) {
	t.Parallel() // beside the quiet scenarios only: see completedWatch
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	goroot, downloads := framework.GoPaths(t)
	e.CreateHelloSource(ctx, "hello-src")
	pvs := e.WatchPVs(ctx)
	runs := framework.BuildRunsFromEnv(t)
	const cache = "go"

	var cold goBuild
	var warm []time.Duration
	for i := 0; i <= runs.Warm; i++ {
		name := "cold"
		if i > 0 {
			name = fmt.Sprintf("warm-%d", i)
		}
		wf := e.object(goBuildWorkflow, name, false, e.Node.Name, goroot, downloads)
		withClaimTemplate(wf, cacheClaimTemplate(cache))
		b := e.goBuild(ctx, wf)
		if !b.Succeeded() {
			t.Fatalf("Workflow %s: %s %s", name, b.Phase, b.Message)
		}
		if i == 0 {
			cold = b
			if b.CacheBefore != "0" {
				t.Errorf("cold build found %s files in GOCACHE, want 0", b.CacheBefore)
			}
		} else {
			warm = append(warm, b.Seconds)
			if b.CacheBefore == "0" {
				t.Errorf("Workflow %s found GOCACHE empty: the earlier commits did not reach it", name)
			}
		}

		// Argo deletes the successful Workflow's claim at completion; the
		// build ends then, and it succeeded.
		claim := claimName(name, "cache")
		pv := pvs.Wait(ctx, t, claim)
		e.waitClaimGone(ctx, claim)
		if reason, msg := e.VolumeEnd(ctx, claim, pv.Name); reason != "Committed" {
			t.Fatalf("volume of Workflow %s: %s (%s), want Committed", name, reason, msg)
		}
		e.expectPodOutcome(pvs, pv.Name, v1alpha1.OutcomeSucceeded)
		if g := e.CacheGeneration(ctx, e.Node, cache); g != i+1 {
			t.Errorf("cache %s is at generation %d after Workflow %s, want %d", cache, g, name, i+1)
		}
		if _, err := e.Dyn.Resource(workflowsGVR).Namespace(e.Namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("Workflow %s should still exist after its claim was committed: %v", name, err)
		}
	}

	times := framework.BuildTimes{Cold: cold.Seconds, Warm: framework.Median(warm), WarmRuns: runs.Warm}
	if runs.Ceiling {
		times.HostPathCold, times.HostPathWarm = e.hostPathBuilds(ctx, runs.Warm, goroot, downloads)
	}
	times.Log(t, "Argo Workflows")
	if times.Warm*3 > times.Cold {
		t.Errorf("warm build took %s, cold %s: the warm build should be several times faster", times.Warm, times.Cold)
	}
}

// hostPathBuilds runs the same builds on a hostPath directory of the
// node, cold and then warm times: the ceiling. It returns the cold time
// and the warm builds' median.
func (e *env) hostPathBuilds(ctx context.Context, warm int, goroot, downloads string) (cold, warmMedian time.Duration) {
	e.t.Helper()
	dir := path.Join("/var/tmp/layercache-e2e-argo", e.Namespace)
	e.HostPathCacheDir(ctx, e.Node, dir)
	var warmTimes []time.Duration
	for i := 0; i <= warm; i++ {
		name := fmt.Sprintf("hostpath-%d", i)
		wf := e.object(goBuildWorkflow, name, false, e.Node.Name, goroot, downloads)
		withVolume(wf, map[string]any{"name": "cache", "hostPath": map[string]any{"path": dir, "type": "Directory"}})
		b := e.goBuild(ctx, wf)
		if !b.Succeeded() {
			e.t.Fatalf("Workflow %s: %s %s", name, b.Phase, b.Message)
		}
		if i == 0 {
			cold = b.Seconds
		} else {
			warmTimes = append(warmTimes, b.Seconds)
		}
	}
	return cold, framework.Median(warmTimes)
}

// goBuild runs a goBuildWorkflow and reads its build's outputs.
func (e *env) goBuild(ctx context.Context, wf *unstructured.Unstructured) goBuild {
	e.t.Helper()
	w := e.run(ctx, wf)
	b := goBuild{workflow: w}
	if !w.Succeeded() {
		return b
	}
	out := e.outputs(w, "build")
	b.Seconds = e.seconds(w, out, "build-seconds")
	b.CacheBefore = out["cache-before"]
	e.t.Logf("Workflow %s: build %s, %s files in GOCACHE before", w.Obj.GetName(), b.Seconds, b.CacheBefore)
	return b
}
