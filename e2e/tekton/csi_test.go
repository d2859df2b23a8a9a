//go:build e2e

package tekton

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// csiGoBuildTaskRun is the Go build of goBuildPipeline as one TaskRun:
// its cache workspace is a CSI inline volume of layercache's driver, so
// no claim or PV is made; the volume belongs to the TaskRun's pod and is
// committed (or discarded) when the pod ends. A checkout step copies the
// source from a ConfigMap workspace, the build step compiles it with
// GOCACHE and GOMODCACHE on the cache workspace as framework.BuildUID.
// Arguments: name, node, cache, GOROOT and the module download cache on
// the node, the build user.
const csiGoBuildTaskRun = `
apiVersion: tekton.dev/v1
kind: TaskRun
metadata:
  name: %[1]s
spec:
  podTemplate:
    securityContext: {runAsUser: %[6]d, runAsGroup: %[6]d, runAsNonRoot: true}
    nodeSelector: {kubernetes.io/hostname: %[2]s}
  workspaces:
  - name: source
    configMap: {name: hello-src}
  - name: cache
    csi:
      driver: ` + v1alpha1.CSIDriverName + `
      volumeAttributes: {cache: %[3]s}
  taskSpec:
    workspaces: [{name: cache}, {name: source}]
    results: [{name: build-seconds}, {name: cache-before}]
    volumes:
    - name: goroot
      hostPath: {path: %[4]s, type: Directory}
    - name: goproxy
      hostPath: {path: %[5]s, type: Directory}
    steps:
    - name: checkout
      image: ` + busyboxImage + `
      script: |
        set -eu
        src=$(workspaces.cache.path)/src
        rm -rf "$src"
        mkdir -p "$src"
        cp $(workspaces.source.path)/main.go $(workspaces.source.path)/go.mod $(workspaces.source.path)/go.sum "$src/"
        echo "$(context.taskRun.name)" > "$src/checked-out-by"
    - name: build
      image: ` + busyboxImage + `
      volumeMounts:
      - {name: goroot, mountPath: /usr/local/go, readOnly: true}
      - {name: goproxy, mountPath: /goproxy, readOnly: true}
      env:
      - {name: PATH, value: "/usr/local/go/bin:/bin:/usr/bin"}
      - {name: HOME, value: /tmp}
      - {name: GOCACHE, value: $(workspaces.cache.path)/go-build}
      - {name: GOMODCACHE, value: $(workspaces.cache.path)/go-mod}
      - {name: GOPROXY, value: "file:///goproxy"}
      - {name: GOSUMDB, value: "off"}
      - {name: GOFLAGS, value: "-mod=mod"}
      - {name: GOTOOLCHAIN, value: local}
      - {name: GOTELEMETRY, value: "off"}
      - {name: CGO_ENABLED, value: "0"}
      script: |
        set -eu
        cd $(workspaces.cache.path)/src
        test "$(cat checked-out-by)" = "$(context.taskRun.name)"
        test "$(id -u)" = %[6]d
        find "$GOCACHE" -type f 2>/dev/null | wc -l | tr -d ' \n' > $(results.cache-before.path)
        start=$(cut -d' ' -f1 /proc/uptime)
        go build -o /tmp/hello .
        end=$(cut -d' ' -f1 /proc/uptime)
        awk -v s="$start" -v e="$end" 'BEGIN { printf "%%.2f", e - s }' > $(results.build-seconds.path)
        /tmp/hello --name "$(context.taskRun.name)"
`

// TestTaskRunCSIWorkspace: a TaskRun's cache workspace is a CSI inline
// volume (driver layercache.dev), which Tekton v1.6.0 turns into the
// pod's spec.volumes[].csi. The first TaskRun builds cold and its pod's
// end commits the volume (Event Committed on the pod); the second builds
// warm from that commit. No PVC or PV is ever made.
func TestTaskRunCSIWorkspace(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	goroot, downloads := framework.GoPaths(t)
	e.CreateHelloSource(ctx, "hello-src")
	const cache = "gobuild"

	var seconds []time.Duration
	for i, name := range []string{"cold", "warm"} {
		e.create(ctx, taskRunsGVR, e.object(csiGoBuildTaskRun, name, e.Node.Name, cache, goroot, downloads, framework.BuildUID))
		r := e.waitRun(ctx, taskRunsGVR, name)
		t.Logf("TaskRun %s: succeeded=%t results=%v", name, r.Succeeded, r.Results)
		if !r.Succeeded {
			t.Fatalf("TaskRun %s: %s", name, r.Reason)
		}
		seconds = append(seconds, e.seconds(r, "build-seconds"))
		switch before := r.Results["cache-before"]; {
		case i == 0 && before != "0":
			t.Errorf("cold build found %s files in GOCACHE, want 0", before)
		case i == 1 && before == "0":
			t.Errorf("warm build found GOCACHE empty: the cold TaskRun's commit did not reach it")
		}

		pod, _, _ := unstructured.NestedString(r.Obj.Object, "status", "podName")
		if pod == "" {
			t.Fatalf("TaskRun %s has no status.podName", name)
		}
		e.ExpectCSIVolume(ctx, pod, cache)
		reason, msg := e.CSIVolumeEnd(ctx, pod)
		want := fmt.Sprintf("as generation %d of cache %s/%s", i+1, e.Namespace, cache)
		if reason != "Committed" || !strings.HasPrefix(msg, "committed volume csi-") || !strings.Contains(msg, want) {
			t.Fatalf("volume of TaskRun %s (pod %s): %s: %q, want Committed: \"committed volume csi-... %s ...\"", name, pod, reason, msg, want)
		}
		t.Logf("TaskRun %s, pod %s: %s: %s", name, pod, reason, msg)
		if g := e.CacheGeneration(ctx, e.Node, cache); g != i+1 {
			t.Errorf("cache %s is at generation %d after TaskRun %s, want %d", cache, g, name, i+1)
		}
		e.ExpectNoClaims(ctx)
	}
	cold, warm := seconds[0], seconds[1]
	t.Logf("Tekton build step on a CSI workspace: cold %.2fs, warm %.2fs (%.1fx)", cold.Seconds(), warm.Seconds(), cold.Seconds()/warm.Seconds())
	if warm*3 > cold {
		t.Errorf("warm build took %s, cold %s: the warm build should be several times faster", warm, cold)
	}
}
