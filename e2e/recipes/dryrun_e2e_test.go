//go:build e2e

package recipes

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
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

// TestDocsDryRun has the API server of the local cluster validate the
// Kubernetes objects of the docs' YAML blocks (docObjects, docs_test.go):
// the Jobs, pods, claims and StorageClasses, each created with a server-side
// dry run, the namespaced ones in the test's namespace and the
// StorageClasses under a name of their own (the docs show classes that
// config/ installs, whose names exist).
func TestDocsDryRun(t *testing.T) {
	t.Parallel()
	f := framework.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	objs := docObjects(t)
	if len(objs) == 0 {
		t.Fatal("no Kubernetes objects in the docs")
	}
	for i, o := range objs {
		var err error
		switch obj := o.obj.(type) {
		case *batchv1.Job:
			obj.Namespace = f.Namespace
			_, err = f.Client.BatchV1().Jobs(f.Namespace).Create(ctx, obj, dryRun)
		case *corev1.Pod:
			obj.Namespace = f.Namespace
			_, err = f.Client.CoreV1().Pods(f.Namespace).Create(ctx, obj, dryRun)
		case *corev1.PersistentVolumeClaim:
			obj.Namespace = f.Namespace
			_, err = f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).Create(ctx, obj, dryRun)
		case *storagev1.StorageClass:
			obj.Name = fmt.Sprintf("docs-%d-%s", i, obj.Name)
			_, err = f.Client.StorageV1().StorageClasses().Create(ctx, obj, dryRun)
		default:
			t.Errorf("%s: %T: this test does not create that kind; add it", o.where, o.obj)
			continue
		}
		if err != nil {
			t.Errorf("%s: the API server refuses it: %v", o.where, err)
		}
	}
}
