package kittest

import (
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/layercache/layercache/api/v1alpha1"
)

// BuildPod is the name of the build pod the tests' claims belong to.
const BuildPod = "build-7x2k"

// Class is the StorageClass "layercache", late-binding, with params.
func Class(params map[string]string) *storagev1.StorageClass {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	return &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "layercache"},
		Provisioner:       v1alpha1.ProvisionerName,
		VolumeBindingMode: &wffc,
		Parameters:        params,
	}
}

// Claim is the claim "build-cache" of namespace, with annotations ann.
func Claim(namespace string, ann map[string]string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
		Namespace: namespace, Name: "build-cache", UID: "0c5e7a38-6c2d-4a8e-9a1f-1d2b3c4d5e6f", Annotations: ann,
	}}
}

// EphemeralPod is a pod of namespace "ci" on node-a with a generic
// ephemeral volume "cache", whose claim is named after the pod
// (NAME-cache); its one container runs, or has exited.
func EphemeralPod(name string, phase corev1.PodPhase, running bool) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: "node-a", Volumes: []corev1.Volume{{
			Name: "cache", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}},
		}}},
		Status: corev1.PodStatus{Phase: phase},
	}
	state := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}
	if running {
		state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: state}}
	return pod
}
