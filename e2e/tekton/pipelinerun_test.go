//go:build e2e

package tekton

import (
	"context"
	"fmt"
	"path"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// goBuildPipeline checks the source out into the cache workspace (from a
// ConfigMap workspace, a stand-in for a git clone), then builds it there:
// the build Task runs after checkout on the same claim, checks that it sees
// what checkout wrote in this run, and compiles with GOCACHE and GOMODCACHE
// on the workspace. Its results are the build's wall time in seconds and
// the number of files GOCACHE held before it. Arguments: GOROOT and the
// module download cache on the node.
const goBuildPipeline = `
apiVersion: tekton.dev/v1
kind: Pipeline
metadata:
  name: go-build
spec:
  params:
  - name: fail
    default: "false"
  workspaces:
  - name: cache
  - name: source
  results:
  - name: build-seconds
    value: $(tasks.build.results.build-seconds)
  - name: cache-before
    value: $(tasks.build.results.cache-before)
  tasks:
  - name: checkout
    workspaces:
    - {name: cache, workspace: cache}
    - {name: source, workspace: source}
    taskSpec:
      workspaces: [{name: cache}, {name: source}]
      steps:
      - name: checkout
        image: ` + busyboxImage + `
        script: |
          set -eu
          src=$(workspaces.cache.path)/src
          rm -rf "$src"
          mkdir -p "$src"
          cp $(workspaces.source.path)/main.go $(workspaces.source.path)/go.mod $(workspaces.source.path)/go.sum "$src/"
          echo "$(context.pipelineRun.name)" > "$src/checked-out-by"
  - name: build
    runAfter: [checkout]
    params: [{name: fail, value: $(params.fail)}]
    workspaces: [{name: cache, workspace: cache}]
    taskSpec:
      params: [{name: fail}]
      workspaces: [{name: cache}]
      results: [{name: build-seconds}, {name: cache-before}]
      volumes:
      - name: goroot
        hostPath: {path: %[1]s, type: Directory}
      - name: goproxy
        hostPath: {path: %[2]s, type: Directory}
      steps:
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
          # The checkout Task of this very run wrote the source.
          test "$(cat checked-out-by)" = "$(context.pipelineRun.name)"
          echo "building as uid $(id -u)"
          find "$GOCACHE" -type f 2>/dev/null | wc -l | tr -d ' \n' > $(results.cache-before.path)
          start=$(cut -d' ' -f1 /proc/uptime)
          go build -o /tmp/hello .
          end=$(cut -d' ' -f1 /proc/uptime)
          awk -v s="$start" -v e="$end" 'BEGIN { printf "%%.2f", e - s }' > $(results.build-seconds.path)
          /tmp/hello --name "$(context.pipelineRun.name)"
          if [ "$(params.fail)" = true ]; then
            echo "written by a failed build" > $(workspaces.cache.path)/poison
            exit 1
          fi
`

// goBuildRun runs goBuildPipeline as the build user on the scenario's node.
// Arguments: name, fail, node, and the cache workspace's binding.
const goBuildRun = `
apiVersion: tekton.dev/v1
kind: PipelineRun
metadata:
  name: %s
spec:
  pipelineRef: {name: go-build}
  params: [{name: fail, value: "%t"}]
  taskRunTemplate:
    podTemplate:
      securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
      nodeSelector: {kubernetes.io/hostname: %s}
  workspaces:
  - name: source
    configMap: {name: hello-src}
  - name: cache
%s
`

// cacheTemplate binds a workspace to a claim per run, annotated with the
// cache, as a Tekton user adds layercache to a PipelineRun.
func cacheTemplate(cache string) string {
	return fmt.Sprintf(`    volumeClaimTemplate:
      metadata:
        annotations:
          %s: %s
      spec:
        storageClassName: %s
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 1Gi}}`, v1alpha1.AnnotationCache, cache, storageClass)
}

// TestPipelineRunWarmCache: a PipelineRun's workspace from a
// volumeClaimTemplate that names a cache; two Tasks in sequence share it;
// the claim (and so the build) ends when the PipelineRun is deleted, which
// commits it; the next PipelineRun's build starts warm. The same builds on
// a hostPath workspace give the physical ceiling (framework.BuildRuns: in
// make bench-builds).
func TestPipelineRunWarmCache(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	goroot, downloads := framework.GoPaths(t)
	e.CreateHelloSource(ctx, "hello-src")
	e.create(ctx, pipelinesGVR, e.object(goBuildPipeline, goroot, downloads))
	runs := framework.BuildRunsFromEnv(t)
	const cache = "go"

	// Cold: an empty cache.
	cold := e.pipelineRun(ctx, "cold", false, cacheTemplate(cache))
	if !cold.Succeeded {
		t.Fatalf("PipelineRun cold: %s", cold.Reason)
	}
	if n := cold.Results["cache-before"]; n != "0" {
		t.Errorf("cold build found %s files in GOCACHE, want 0", n)
	}
	claim := e.claimOf(ctx, cold.Obj)
	e.expectClaimKept(ctx, claim, cache)

	// Deleting the PipelineRun deletes its claim: the build ends, and it
	// succeeded.
	e.deleteRun(ctx, pipelineRunsGVR, "cold")
	if reason, msg := e.VolumeEnd(ctx, claim.Name, claim.Spec.VolumeName); reason != "Committed" {
		t.Fatalf("volume of PipelineRun cold: %s (%s), want Committed", reason, msg)
	}
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 1 {
		t.Errorf("cache %s is at generation %d after the first PipelineRun, want 1", cache, g)
	}

	// Warm: the next PipelineRuns find the build cache; each commits again.
	var warm []run
	for i := 1; i <= runs.Warm; i++ {
		name := fmt.Sprintf("warm-%d", i)
		r := e.pipelineRun(ctx, name, false, cacheTemplate(cache))
		if !r.Succeeded {
			t.Fatalf("PipelineRun %s: %s", name, r.Reason)
		}
		if r.Results["cache-before"] == "0" {
			t.Errorf("PipelineRun %s found GOCACHE empty: the earlier commits did not reach it", name)
		}
		c := e.claimOf(ctx, r.Obj)
		e.deleteRun(ctx, pipelineRunsGVR, name)
		if reason, msg := e.VolumeEnd(ctx, c.Name, c.Spec.VolumeName); reason != "Committed" {
			t.Errorf("volume of PipelineRun %s: %s (%s), want Committed", name, reason, msg)
		}
		warm = append(warm, r)
	}

	times := framework.BuildTimes{Cold: e.seconds(cold, "build-seconds"), Warm: e.median(warm), WarmRuns: runs.Warm}
	if runs.Ceiling {
		// The ceiling: the same builds on a plain hostPath volume.
		hostCold, hostWarm := e.hostPathBuilds(ctx, runs.Warm)
		times.HostPathCold, times.HostPathWarm = e.seconds(hostCold, "build-seconds"), e.median(hostWarm)
	}
	times.Log(t, "Tekton")
	if times.Warm*3 > times.Cold {
		t.Errorf("warm build took %s, cold %s: the warm build should be several times faster", times.Warm, times.Cold)
	}
}

// pipelineRun creates a goBuildRun and waits until it is done.
func (e *env) pipelineRun(ctx context.Context, name string, fail bool, workspace string) run {
	e.t.Helper()
	e.create(ctx, pipelineRunsGVR, e.object(goBuildRun, name, fail, e.Node.Name, workspace))
	r := e.waitRun(ctx, pipelineRunsGVR, name)
	e.t.Logf("PipelineRun %s: succeeded=%t results=%v", name, r.Succeeded, r.Results)
	return r
}

// expectClaimKept checks what Tekton v1.6.0 does with a workspace claim
// at the PipelineRun's completion under its default coschedule mode
// (workspaces): it deletes the affinity assistant's StatefulSet but leaves
// the claim, which the PipelineRun owns, until the PipelineRun is deleted
// (pipelinerun.go Reconcile -> cleanupAffinityAssistantsAndPVCs, case
// AffinityAssistantPerWorkspace). So the build has not ended: nothing is
// committed yet.
func (e *env) expectClaimKept(ctx context.Context, claim *corev1.PersistentVolumeClaim, cache string) {
	e.t.Helper()
	select {
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
		e.t.Fatal(ctx.Err())
	}
	got, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("the workspace claim %s 10s after the PipelineRun completed: %v (Tekton's default coschedule mode keeps it until the PipelineRun is deleted)", claim.Name, err)
	}
	if got.DeletionTimestamp != nil {
		e.t.Errorf("the workspace claim %s is being deleted 10s after the PipelineRun completed", claim.Name)
	}
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 0 {
		e.t.Errorf("cache %s is at generation %d while the completed PipelineRun still holds its claim, want 0", cache, g)
	}
	e.t.Logf("PipelineRun completed: workspace claim %s kept (owner: %s), cache %s not committed yet", claim.Name, ownerNames(got), cache)
}

func ownerNames(obj metav1.Object) string {
	s := ""
	for _, ref := range obj.GetOwnerReferences() {
		s += ref.Kind + "/" + ref.Name + " "
	}
	return s
}

// median is the median build time of runs.
func (e *env) median(runs []run) time.Duration {
	e.t.Helper()
	var d []time.Duration
	for _, r := range runs {
		d = append(d, e.seconds(r, "build-seconds"))
	}
	return framework.Median(d)
}

// hostPathBuilds runs the build on a hostPath PV (a directory of the node
// owned by the build user), cold and then warmRuns times warm.
func (e *env) hostPathBuilds(ctx context.Context, warmRuns int) (cold run, warm []run) {
	e.t.Helper()
	dir := path.Join("/var/tmp/layercache-e2e-tekton", e.Namespace)
	e.HostPathCacheDir(ctx, e.Node, dir)
	pvName := e.Namespace + "-hostpath"
	hostPathType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostPathType}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: e.Namespace, Name: "hostpath-cache"},
		},
	}
	if _, err := e.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = e.Client.CoreV1().PersistentVolumes().Delete(ctx, pvName, metav1.DeleteOptions{})
	})
	empty := ""
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "hostpath-cache"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &empty,
			VolumeName:       pvName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	binding := "    persistentVolumeClaim: {claimName: hostpath-cache}"
	cold = e.pipelineRun(ctx, "hostpath-cold", false, binding)
	if !cold.Succeeded {
		e.t.Fatalf("PipelineRun hostpath-cold: %s", cold.Reason)
	}
	for i := 1; i <= warmRuns; i++ {
		r := e.pipelineRun(ctx, fmt.Sprintf("hostpath-warm-%d", i), false, binding)
		if !r.Succeeded {
			e.t.Fatalf("PipelineRun %s: %s", r.Obj.GetName(), r.Reason)
		}
		warm = append(warm, r)
	}
	return cold, warm
}
