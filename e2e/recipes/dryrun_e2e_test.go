//go:build e2e

package recipes

import (
	"context"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/e2e/framework"
)

// TestRecipesDryRun has the API server of the local cluster validate the
// recipes' objects (server-side dry run): the pods each CI system would
// run and the StorageClass. ARC's AutoscalingRunnerSet and GitLab's and
// Jenkins' own configuration are not Kubernetes objects here; the unit
// tests parse those.
func TestRecipesDryRun(t *testing.T) {
	t.Parallel()
	f := framework.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	for system, pod := range recipePods(t) {
		pod.Name = "recipe-" + system
		pod.Namespace = f.Namespace
		if _, err := f.Client.CoreV1().Pods(f.Namespace).Create(ctx, pod, dryRun); err != nil {
			t.Errorf("the %s recipe's pod is refused by the API server: %v", system, err)
		}
	}
	var sc storagev1.StorageClass
	strict(t, "storageclass-by-pod-label.yaml", readFile(t, "storageclass-by-pod-label.yaml"), &sc)
	if _, err := f.Client.StorageV1().StorageClasses().Create(ctx, &sc, dryRun); err != nil {
		t.Errorf("the StorageClass recipe is refused by the API server: %v", err)
	}
}
