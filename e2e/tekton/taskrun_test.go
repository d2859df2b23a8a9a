//go:build e2e

package tekton

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/layercache/layercache/api/v1alpha1"
)

// ephemeralTaskRun is a TaskRun whose pod gets a generic ephemeral cache
// volume through its podTemplate, without a workspace: the claim belongs
// to the TaskRun's pod and the build ends with it. The step counts the
// runs the cache has seen and adds its own. Arguments: name, node, cache,
// class.
const ephemeralTaskRun = `
apiVersion: tekton.dev/v1
kind: TaskRun
metadata:
  name: %[1]s
spec:
  podTemplate:
    securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
    nodeSelector: {kubernetes.io/hostname: %[2]s}
    volumes:
    - name: cache
      ephemeral:
        volumeClaimTemplate:
          metadata:
            annotations:
              ` + v1alpha1.AnnotationCache + `: %[3]s
          spec:
            storageClassName: %[4]s
            accessModes: [ReadWriteOnce]
            resources: {requests: {storage: 1Gi}}
  taskSpec:
    results: [{name: seen}]
    steps:
    - name: use
      image: ` + busyboxImage + `
      volumeMounts: [{name: cache, mountPath: /cache}]
      script: |
        set -eu
        touch /cache/runs
        wc -l < /cache/runs | tr -d ' \n' > $(results.seen.path)
        echo "$(context.taskRun.name)" >> /cache/runs
`

// TestTaskRunEphemeralCache: a Task-level cache through a generic
// ephemeral volume; the first TaskRun's pod commits it at its end, the
// second sees it.
func TestTaskRunEphemeralCache(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const cache = "task-cache"

	for i, name := range []string{"first", "second"} {
		e.create(ctx, taskRunsGVR, e.object(ephemeralTaskRun, name, e.Node.Name, cache, storageClass))
		r := e.waitRun(ctx, taskRunsGVR, name)
		if !r.Succeeded {
			t.Fatalf("TaskRun %s: %s", name, r.Reason)
		}
		if got, want := r.Results["seen"], fmt.Sprint(i); got != want {
			t.Errorf("TaskRun %s saw %s earlier runs in the cache, want %s", name, got, want)
		}
		// The pod's claim is <pod>-cache; its pod ended, so it ends now,
		// while the TaskRun and its pod stay.
		pod, _, _ := unstructured.NestedString(r.Obj.Object, "status", "podName")
		claim := pod + "-cache"
		pvc, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("claim %s of TaskRun %s: %v", claim, name, err)
		}
		if reason, msg := e.VolumeEnd(ctx, claim, pvc.Spec.VolumeName); reason != "Committed" {
			t.Fatalf("volume of TaskRun %s: %s (%s), want Committed", name, reason, msg)
		}
	}
	if g := e.CacheGeneration(ctx, e.Node, cache); g != 2 {
		t.Errorf("cache %s is at generation %d after two TaskRuns, want 2", cache, g)
	}
}
