//go:build e2e

package cache

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestStorageClassCacheTemplate names caches the way CI charts that cannot
// annotate their claims need: a StorageClass whose cache parameter is a
// template over the owning pod's labels and the volume's name. A pod that
// lacks the label gets a Warning Event on its claim and no volume.
func TestStorageClassCacheTemplate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()

	class := e.templateClass(ctx, "{{ .Pod.Labels.app }}-{{ .Volume }}")
	labelled := func(name string, labels map[string]string, script string) *corev1.Pod {
		pod := e.cachePod(name, nil, script)
		pod.Labels = labels
		pod.Spec.Volumes[0].Ephemeral.VolumeClaimTemplate.Spec.StorageClassName = &class
		return pod
	}
	first := e.runPod(ctx, labelled("web-1", map[string]string{"app": "web"}, "echo web-1 > /cache/out"), corev1.PodSucceeded)
	e.expectVolumeEnd(ctx, first.Name, "Committed")
	e.waitGeneration(ctx, "web-"+volumeName, 1)

	second := e.runPod(ctx, labelled("web-2", map[string]string{"app": "web"}, "cat /cache/out"), corev1.PodSucceeded)
	if got := e.logs(ctx, second.Name); got != "web-1\n" {
		t.Errorf("the second pod of app web reads %q, want the first one's output", got)
	}

	if _, err := e.CreatePod(ctx, labelled("nolabel", nil, "true")); err != nil {
		t.Fatal(err)
	}
	e.waitClaimRefused(ctx, "nolabel", "CacheTemplateFailed", `map has no entry for key "app"`, "give pod nolabel the label")
}

// templateClass creates a layercache StorageClass of the scenario whose
// cache parameter is template, deleted when the test ends.
func (e *env) templateClass(ctx context.Context, template string) string {
	e.t.Helper()
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: e.Namespace + "-template"},
		Provisioner:       v1alpha1.ProvisionerName,
		VolumeBindingMode: &wffc,
		Parameters:        map[string]string{"cache": template},
	}
	classes := e.Client.StorageV1().StorageClasses()
	if _, err := classes.Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating StorageClass %s: %v", sc.Name, err)
	}
	e.t.Cleanup(func() {
		if err := classes.Delete(context.WithoutCancel(ctx), sc.Name, metav1.DeleteOptions{}); err != nil {
			e.t.Errorf("deleting StorageClass %s: %v", sc.Name, err)
		}
	})
	return sc.Name
}
