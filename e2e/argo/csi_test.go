//go:build e2e

package argo

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// csiGoBuildWorkflow is the Go build of goBuildWorkflow as one step: the
// step's template declares its cache as a CSI inline volume of
// layercache's driver in its own volumes, so Argo puts it in the step's
// pod as spec.volumes[].csi; no claim or PV is made, and the volume is
// committed (or discarded) when the pod ends. The step copies the source
// from a ConfigMap and compiles it with GOCACHE and GOMODCACHE on the
// cache as framework.BuildUID; with fail it then writes to the cache and
// exits 1. Arguments: name, fail, node, cache, GOROOT and the module
// download cache on the node, the build user.
const csiGoBuildWorkflow = `
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  name: %[1]s
spec:
  entrypoint: build
  serviceAccountName: ` + serviceAccount + `
  arguments:
    parameters: [{name: fail, value: "%[2]t"}]
  securityContext: {runAsUser: %[7]d, runAsGroup: %[7]d, runAsNonRoot: true}
  nodeSelector: {kubernetes.io/hostname: %[3]s}
  volumes:
  - name: source
    configMap: {name: hello-src}
  - name: goroot
    hostPath: {path: %[5]s, type: Directory}
  - name: goproxy
    hostPath: {path: %[6]s, type: Directory}
  templates:
  - name: build
    volumes:
    - name: cache
      csi:
        driver: ` + v1alpha1.CSIDriverName + `
        volumeAttributes: {cache: %[4]s}
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
        test "$(id -u)" = %[7]d
        rm -rf /cache/src
        mkdir -p /cache/src
        cp /source/main.go /source/go.mod /source/go.sum /cache/src/
        cd /cache/src
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
      - {name: source, mountPath: /source}
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

// TestWorkflowCSIVolumeCache: a step's template has a layercache CSI
// inline volume. The first Workflow builds cold and its pod's end commits
// the volume (Event Committed on the pod); the second builds warm from
// that commit and commits again; a third whose step fails after writing
// to the cache is discarded (Event Discarded on the pod: its pod failed)
// and the cache stays where it was. No PVC or PV is ever made.
func TestWorkflowCSIVolumeCache(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	goroot, downloads := framework.GoPaths(t)
	e.CreateHelloSource(ctx, "hello-src")
	const cache = "gobuild"

	var seconds []time.Duration
	for i, name := range []string{"cold", "warm"} {
		b := e.goBuild(ctx, e.object(csiGoBuildWorkflow, name, false, e.Node.Name, cache, goroot, downloads, framework.BuildUID))
		if !b.Succeeded() {
			t.Fatalf("Workflow %s: %s %s", name, b.Phase, b.Message)
		}
		seconds = append(seconds, b.Seconds)
		switch {
		case i == 0 && b.CacheBefore != "0":
			t.Errorf("cold build found %s files in GOCACHE, want 0", b.CacheBefore)
		case i == 1 && b.CacheBefore == "0":
			t.Errorf("warm build found GOCACHE empty: the cold Workflow's commit did not reach it")
		}
		pod := e.stepPod(ctx, name)
		e.ExpectCSIVolume(ctx, pod, cache)
		reason, msg := e.CSIVolumeEnd(ctx, pod)
		want := fmt.Sprintf("as generation %d of cache %s/%s", i+1, e.Namespace, cache)
		if reason != "Committed" || !strings.HasPrefix(msg, "committed volume csi-") || !strings.Contains(msg, want) {
			t.Fatalf("volume of Workflow %s (pod %s): %s: %q, want Committed: \"committed volume csi-... %s ...\"", name, pod, reason, msg, want)
		}
		t.Logf("Workflow %s, pod %s: %s: %s", name, pod, reason, msg)
		if g := e.CacheGeneration(ctx, e.Node, cache); g != i+1 {
			t.Errorf("cache %s is at generation %d after Workflow %s, want %d", cache, g, name, i+1)
		}
		e.ExpectNoClaims(ctx)
	}
	cold, warm := seconds[0], seconds[1]
	t.Logf("Argo build step on a CSI volume: cold %.2fs, warm %.2fs (%.1fx)", cold.Seconds(), warm.Seconds(), cold.Seconds()/warm.Seconds())
	if warm*3 > cold {
		t.Errorf("warm build took %s, cold %s: the warm build should be several times faster", warm, cold)
	}

	// A failed step: its changes (a warm build's new entries and
	// /cache/poison) are discarded at its pod's end.
	w := e.run(ctx, e.object(csiGoBuildWorkflow, "failed", true, e.Node.Name, cache, goroot, downloads, framework.BuildUID))
	if w.Phase != "Failed" {
		t.Fatalf("Workflow failed is %s, want Failed: its step exits 1", w.Phase)
	}
	pod := e.stepPod(ctx, "failed")
	reason, msg := e.CSIVolumeEnd(ctx, pod)
	if reason != "Discarded" || !strings.Contains(msg, "its pod failed") {
		t.Errorf("volume of the failed Workflow (pod %s): %s: %q, want Discarded because its pod failed", pod, reason, msg)
	}
	t.Logf("Workflow failed, pod %s: %s: %s", pod, reason, msg)
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 2 {
		t.Errorf("cache %s is at generation %d after a failed Workflow, want 2", cache, g)
	}
	e.ExpectNoClaims(ctx)
}
