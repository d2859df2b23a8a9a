//go:build e2e

package cache

import (
	"context"
	"os"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
)

// exampleJob is the quick start's workload.
const exampleJob = "../examples/build-job.yaml"

// TestExampleBuildJob runs the quick start: the example Job twice, as a
// user applies it, deleting the first run in between. The second run must
// list what the first one left. Only the node is pinned, so that the cache
// is reused on a cluster of several nodes.
func TestExampleBuildJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()

	b, err := os.ReadFile(exampleJob)
	if err != nil {
		t.Fatal(err)
	}
	var job batchv1.Job
	if err := yaml.UnmarshalStrict(b, &job); err != nil {
		t.Fatalf("%s: %v", exampleJob, err)
	}
	vols := job.Spec.Template.Spec.Volumes
	if len(vols) != 1 || vols[0].Ephemeral == nil ||
		vols[0].Ephemeral.VolumeClaimTemplate.Annotations[v1alpha1.AnnotationCache] != "demo" ||
		*vols[0].Ephemeral.VolumeClaimTemplate.Spec.StorageClassName != v1alpha1.StorageClassName {
		t.Fatalf("%s: want one generic ephemeral volume of class %s annotated %s: demo, got %+v", exampleJob, v1alpha1.StorageClassName, v1alpha1.AnnotationCache, vols)
	}
	job.Namespace = e.Namespace
	job.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: e.Node.Name}

	var logs []string
	for run := int64(1); run <= 2; run++ {
		pod := e.runJob(ctx, job.DeepCopy())
		podLogs, err := e.PodLogs(ctx, pod.Name, job.Spec.Template.Spec.Containers[0].Name)
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, podLogs)
		e.expectClaimEnd(ctx, pod.Name+"-"+vols[0].Name, "Committed")
		e.waitGeneration(ctx, "demo", run)
		foreground := metav1.DeletePropagationForeground
		if err := e.Client.BatchV1().Jobs(e.Namespace).Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: &foreground}); err != nil {
			t.Fatal(err)
		}
		e.waitJobGone(ctx, job.Name)
	}
	if !strings.Contains(logs[1], "builds.log") || strings.Count(logs[1], "build on ") != 2 {
		t.Errorf("the second run does not show the first run's builds.log:\n%s", logs[1])
	}
}
