//go:build e2e && monitoring && faults

package monitoring

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// TestPublishFailingGoesPendingWithTheRegistryDown stops the registry, runs
// a build whose layer the node must publish, and waits for
// LayercachePublishFailing to go pending (its "for" is 10 minutes: pending
// is the rule's expression matching the fault). The registry is back
// within a minute whatever happens.
func TestPublishFailingGoesPendingWithTheRegistryDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	f := framework.New(t)
	if f.Cluster.Registry == nil {
		t.Fatal("the cluster has no registry in cluster.json: start it with make e2e-up")
	}
	prom := startPrometheus(ctx, t, f)
	prom.waitForTargets(ctx, t)

	if err := f.Cluster.StopRegistry(ctx); err != nil {
		t.Fatalf("stop the registry: %v", err)
	}
	stopped := time.Now()
	defer func() {
		// A fresh context: the registry comes back even after a timeout.
		restart, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.Cluster.StartRegistry(restart); err != nil {
			t.Errorf("restart the registry: %v", err)
		}
		t.Logf("registry down for %s", time.Since(stopped).Round(time.Second))
	}()

	class := f.Cluster.Registry.StorageClass
	pod := framework.BusyboxPod("publish", "sh", "-c", "echo layer > /cache/file")
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: f.Cluster.Nodes[0].Name}
	pod.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
		Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationCache: "monitoring"}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &class,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceStorage: resource.MustParse("1Gi"),
				}},
			},
		}},
	}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}}
	if _, err := f.CreatePod(ctx, pod); err != nil {
		t.Fatalf("create the build pod: %v", err)
	}
	if _, err := f.WaitForPodPhase(ctx, pod.Name, corev1.PodSucceeded); err != nil {
		t.Fatalf("the build pod: %v", err)
	}
	built := time.Now()
	// Back within a minute of the stop, as the shared cluster asks.
	deadline := stopped.Add(50 * time.Second)
	for {
		alerts, err := prom.query(ctx, `ALERTS{alertname="LayercachePublishFailing"}`)
		if err == nil && len(alerts) > 0 {
			t.Logf("LayercachePublishFailing %s %s after the build ended (%s after the registry stopped): %v",
				alerts[0].Metric["alertstate"], time.Since(built).Round(time.Second), time.Since(stopped).Round(time.Second), alerts[0].Metric)
			return
		}
		if time.Now().After(deadline) {
			failures, _ := prom.query(ctx, `layercache_failures_total{operation="push"}`)
			t.Fatalf("LayercachePublishFailing not pending %s after the registry stopped (query error %v); push failures: %v", time.Since(stopped).Round(time.Second), err, failures)
		}
		time.Sleep(time.Second)
	}
}
