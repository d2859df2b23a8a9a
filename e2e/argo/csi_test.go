//go:build e2e

package argo

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

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
		e.expectCSIVolume(ctx, pod, cache)
		reason, msg := e.podVolumeEnd(ctx, pod)
		want := fmt.Sprintf("as generation %d of cache %s/%s", i+1, e.Namespace, cache)
		if reason != "Committed" || !strings.HasPrefix(msg, "committed volume csi-") || !strings.Contains(msg, want) {
			t.Fatalf("volume of Workflow %s (pod %s): %s: %q, want Committed: \"committed volume csi-... %s ...\"", name, pod, reason, msg, want)
		}
		t.Logf("Workflow %s, pod %s: %s: %s", name, pod, reason, msg)
		if g := e.CacheGeneration(ctx, e.Node, cache); g != i+1 {
			t.Errorf("cache %s is at generation %d after Workflow %s, want %d", cache, g, name, i+1)
		}
		e.expectNoClaims(ctx)
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
	reason, msg := e.podVolumeEnd(ctx, pod)
	if reason != "Discarded" || !strings.Contains(msg, "its pod failed") {
		t.Errorf("volume of the failed Workflow (pod %s): %s: %q, want Discarded because its pod failed", pod, reason, msg)
	}
	t.Logf("Workflow failed, pod %s: %s: %s", pod, reason, msg)
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 2 {
		t.Errorf("cache %s is at generation %d after a failed Workflow, want 2", cache, g)
	}
	e.expectNoClaims(ctx)
}

// expectCSIVolume checks that the pod has the layercache CSI inline volume
// of cache, as Argo made it from the template's volumes.
func (e *env) expectCSIVolume(ctx context.Context, pod, cache string) {
	e.t.Helper()
	p, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("pod %s: %v", pod, err)
	}
	var found []string
	for _, v := range p.Spec.Volumes {
		if v.CSI != nil {
			found = append(found, fmt.Sprintf("%s: driver %s, attributes %v", v.Name, v.CSI.Driver, v.CSI.VolumeAttributes))
			if v.CSI.Driver == v1alpha1.CSIDriverName && v.CSI.VolumeAttributes["cache"] == cache {
				return
			}
		}
	}
	e.t.Fatalf("pod %s has no %s CSI volume of cache %s; its CSI volumes: %q", pod, v1alpha1.CSIDriverName, cache, found)
}

// endReasons are the node agent's Events that end a volume.
var endReasons = []string{"Committed", "Discarded", "CommitDropped", "CommitTorn", "CommitOverLimit"}

// podVolumeEnd waits for the node agent's Event on the pod that ends its
// CSI volume (the pod has one) and returns its reason and message.
func (e *env) podVolumeEnd(ctx context.Context, pod string) (reason, message string) {
	e.t.Helper()
	sel := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod}.AsSelector().String()
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, framework.VolumeTimeout, true, func(ctx context.Context) (bool, error) {
		list, err := e.Client.CoreV1().Events(e.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, ev := range list.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			for _, r := range endReasons {
				if ev.Reason == r {
					reason, message = ev.Reason, ev.Message
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("the CSI volume of pod %s did not end within %s: %v; the pod's events: %q", pod, framework.VolumeTimeout, err, seen)
	}
	return reason, message
}

// expectNoClaims checks that the namespace has no claim and no PV is
// bound to one of it: a CSI inline volume makes neither.
func (e *env) expectNoClaims(ctx context.Context) {
	e.t.Helper()
	pvcs, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range pvcs.Items {
		e.t.Errorf("claim %s exists (volume %s); a CSI volume makes none", c.Name, c.Spec.VolumeName)
	}
	pvs, err := e.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == e.Namespace {
			e.t.Errorf("PV %s exists for claim %s; a CSI volume makes none", pv.Name, pv.Spec.ClaimRef.Name)
		}
	}
}
