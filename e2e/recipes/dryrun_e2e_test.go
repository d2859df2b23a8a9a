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
// run, with a claim or a CSI inline volume, and the StorageClasses. ARC's
// AutoscalingRunnerSet, GitLab's and Jenkins' own configuration, Tekton's
// TaskRun and Argo's Workflow are not Kubernetes objects here; the unit
// tests parse those.
func TestRecipesDryRun(t *testing.T) {
	t.Parallel()
	f := framework.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	pods := recipePods(t)
	for system, pod := range csiRecipePods(t) {
		pods[system] = pod
	}
	for system, pod := range pods {
		pod.Name = "recipe-" + system
		pod.Namespace = f.Namespace
		if _, err := f.Client.CoreV1().Pods(f.Namespace).Create(ctx, pod, dryRun); err != nil {
			t.Errorf("the %s recipe's pod is refused by the API server: %v", system, err)
		}
	}
	for _, file := range []string{"storageclass-by-pod-label.yaml", "storageclass-branch.yaml"} {
		var sc storagev1.StorageClass
		strict(t, file, readFile(t, file), &sc)
		if _, err := f.Client.StorageV1().StorageClasses().Create(ctx, &sc, dryRun); err != nil {
			t.Errorf("the StorageClass recipe %s is refused by the API server: %v", file, err)
		}
	}
}
