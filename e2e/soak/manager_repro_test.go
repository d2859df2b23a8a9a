//go:build e2e && faults

package soak

import (
	"context"
	"slices"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// TestStandaloneClaimPodEndsWithoutManager is the smallest version of
// what TestLoadManagerLeader found: a standalone claim released on pod
// exit whose pod succeeds and is deleted while no manager runs (a leader
// killed, the next not yet elected). The manager releases such a claim
// with its pods' outcome, so the pod must outlive it: the node agent holds
// it (finalizer layercache.dev/build-end) until the manager is back and
// has recorded the outcome, and the build is Committed. (Before the hold
// it was Discarded, "its pod's outcome is unknown".) It scales the
// manager's Deployment to 0 and back, so it runs alone (build tag
// faults).
func TestStandaloneClaimPodEndsWithoutManager(t *testing.T) {
	f := framework.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	deps := f.Client.AppsV1().Deployments(framework.SystemNamespace)
	scale := func(ctx context.Context, n int32) error {
		_, err := deps.UpdateScale(ctx, managerDeployment, &autoscalingv1.Scale{
			ObjectMeta: metav1.ObjectMeta{Name: managerDeployment, Namespace: framework.SystemNamespace},
			Spec:       autoscalingv1.ScaleSpec{Replicas: n},
		}, metav1.UpdateOptions{})
		return err
	}
	orig, err := deps.GetScale(ctx, managerDeployment, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the manager's scale: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := scale(ctx, orig.Spec.Replicas); err != nil {
			t.Errorf("scaling the manager back to %d: %v", orig.Spec.Replicas, err)
		}
	})

	b := &build{Name: "b-repro", Cache: "c0"}
	claims := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace)
	l := &load{}
	if _, err := claims.Create(ctx, l.standaloneClaim(b), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The build waits until the manager is gone, then succeeds.
	pod := framework.BusyboxPod(b.Name, "sh", "-c", "sleep 20; echo built > "+mountPath+"/"+b.Name)
	pod.Spec.SecurityContext = nonRoot()
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: volumeName, MountPath: mountPath}}
	pod.Spec.Volumes = []corev1.Volume{{Name: volumeName, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: b.Name + "-" + volumeName},
	}}}
	if _, err := f.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WaitForPodPhase(ctx, b.Name, corev1.PodRunning); err != nil {
		t.Fatal(err)
	}
	claim, err := claims.Get(ctx, b.Name+"-"+volumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claim %s bound to %s, finalizers %v; scaling the manager to 0", claim.Name, claim.Spec.VolumeName, claim.Finalizers)
	if err := scale(ctx, 0); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		ps, err := f.Client.CoreV1().Pods(framework.SystemNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=layercache,app.kubernetes.io/component=" + framework.ComponentManager})
		return err == nil && len(ps.Items) == 0, err
	})
	if err != nil {
		t.Fatalf("the manager's pods did not go: %v", err)
	}
	if _, err := f.WaitForPodPhase(ctx, b.Name, corev1.PodSucceeded); err != nil {
		t.Fatal(err)
	}
	if err := f.Client.CoreV1().Pods(f.Namespace).Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Held: it stays, Terminating, while no manager has its outcome.
	time.Sleep(10 * time.Second)
	held, err := f.Client.CoreV1().Pods(f.Namespace).Get(ctx, b.Name, metav1.GetOptions{})
	if err != nil || held.DeletionTimestamp == nil || !slices.Contains(held.Finalizers, v1alpha1.FinalizerBuildEnd) {
		t.Fatalf("pod %s 10 s after its deletion without a manager: %v, %+v; want it Terminating, held by %s", b.Name, err, held, v1alpha1.FinalizerBuildEnd)
	}
	t.Logf("pod %s succeeded and was deleted, and is held; scaling the manager back to %d", b.Name, orig.Spec.Replicas)
	if err := scale(ctx, orig.Spec.Replicas); err != nil {
		t.Fatal(err)
	}
	reason, message := f.VolumeEnd(ctx, claim.Name, claim.Spec.VolumeName)
	if reason != "Committed" {
		t.Errorf("the succeeded build's standalone claim ended %s %q, want Committed", reason, message)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := f.Client.CoreV1().Pods(f.Namespace).Get(ctx, b.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("pod %s still there once its outcome was recorded: %v", b.Name, err)
	}
	if err := claims.Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting claim %s: %v", claim.Name, err)
	}
}
