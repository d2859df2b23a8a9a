// Package podfacts says what the node agent and the manager both need to
// know of a pod: which claims it uses, which pod owns a claim, whether a pod
// has ended for good, and the phase it ends in. Both act on a build's end,
// so they must agree on when that is.
//
// A pod has ended when no container runs and none will run again. The
// kubelet reports a terminal phase only after it stopped every container,
// but a pod can be made terminal from outside (the pod garbage collector
// marks the pods of a lost node Failed) while a status still says a
// container runs; and the kubelet reports each container's exit about a
// second before the phase. So Ended reads the container statuses both
// ways: a terminal phase counts only once no container runs, and a pod
// whose containers have all exited and will not be restarted has ended
// before its phase says so.
//
// Sidecars. Kubernetes native sidecars (init containers with restartPolicy
// Always) keep running after the pod's containers exit, until the kubelet
// stops them. A pod has not ended while one runs: it may mount the volume
// and write to it, and a commit under a running writer loses data, which is
// worse than a commit a second later. Their exit codes, though, say nothing
// of the build (the kubelet kills them, typically 137) and Kubernetes leaves
// them out of the phase, so FinalPhase leaves them out too. Ephemeral
// (debug) containers are treated alike: they hold the end while they run
// (or may still start), their exit codes do not count. The extra
// containers of Tekton and Argo pods (Tekton's sidecars, Argo's wait
// container) are ordinary containers to Kubernetes: they hold the end and
// their exit codes count, as they do in the phase.
package podfacts

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// Claim is a PersistentVolumeClaim that one of a pod's volumes uses, in the
// pod's namespace.
type Claim struct {
	Volume string // the pod's volume
	Name   string // the claim
	// Owned tells a generic ephemeral volume's claim, which the pod owns
	// and which goes away with it, from a standalone claim it names.
	Owned bool
}

// Claims lists the claims a pod's volumes use.
func Claims(pod *corev1.Pod) []Claim {
	var claims []Claim
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.Ephemeral != nil:
			// The ephemeral-volume controller names the claim so
			// (k8s.io/component-helpers/storage/ephemeral).
			claims = append(claims, Claim{Volume: v.Name, Name: pod.Name + "-" + v.Name, Owned: true})
		case v.PersistentVolumeClaim != nil:
			claims = append(claims, Claim{Volume: v.Name, Name: v.PersistentVolumeClaim.ClaimName})
		}
	}
	return claims
}

// OwningPod returns the reference to the pod that controls the claim (a
// generic ephemeral volume's, or one a CI plugin made for its pod), if any.
// Such a claim cannot outlive its pod.
func OwningPod(claim *corev1.PersistentVolumeClaim) (*metav1.OwnerReference, bool) {
	ref := metav1.GetControllerOf(claim)
	if ref == nil || ref.Kind != "Pod" || ref.APIVersion != "v1" {
		return nil, false
	}
	return ref, true
}

// Terminal tells whether the pod's phase is Succeeded or Failed. A terminal
// pod may still have a container running; see Ended.
func Terminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// Ended tells whether no container of the pod runs and none will run again.
func Ended(pod *corev1.Pod) bool {
	if Terminal(pod) {
		return !slices.ContainsFunc(statuses(pod), isRunning)
	}
	return exitedForGood(pod)
}

// FinalPhase is the phase the pod ends in: its phase once terminal, else
// the one its exited containers foretell once none will run again (the
// kubelet reports it a second later), else "" while it is not known yet.
func FinalPhase(pod *corev1.Pod) corev1.PodPhase {
	switch {
	case Terminal(pod):
		return pod.Status.Phase
	case !exitedForGood(pod):
		return ""
	}
	for _, c := range countedContainers(pod) {
		if terminated(pod, c.Name).ExitCode != 0 {
			return corev1.PodFailed
		}
	}
	return corev1.PodSucceeded
}

// exitedForGood tells whether every container of a pod (sidecars and
// ephemeral containers included) has exited and none will be restarted. A
// container without a status may still start. A pod whose spec lists no
// containers is a cut-down copy (the manager caches such), which cannot
// tell: it waits for the phase.
func exitedForGood(pod *corev1.Pod) bool {
	if len(pod.Spec.Containers) == 0 || slices.ContainsFunc(statuses(pod), isRunning) {
		return false
	}
	for _, c := range pod.Spec.InitContainers {
		t := terminated(pod, c.Name)
		if t == nil || (!isSidecar(c) && mayRestart(pod, c, t.ExitCode)) {
			return false
		}
	}
	for _, c := range pod.Spec.Containers {
		t := terminated(pod, c.Name)
		if t == nil || mayRestart(pod, c, t.ExitCode) {
			return false
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if terminated(pod, c.Name) == nil {
			return false
		}
	}
	return true
}

// mayRestart tells whether the kubelet may start container c again after
// it exited with code. Sidecars aside (the kubelet stops them for good once
// the pod's containers have exited), that is up to the container's restart
// policy, or the pod's. Restart rules (the ContainerRestartRules feature)
// are not read: a container with any may restart.
func mayRestart(pod *corev1.Pod, c corev1.Container, code int32) bool {
	if len(c.RestartPolicyRules) > 0 {
		return true
	}
	policy := corev1.ContainerRestartPolicy(pod.Spec.RestartPolicy)
	if c.RestartPolicy != nil {
		policy = *c.RestartPolicy
	}
	switch policy {
	case corev1.ContainerRestartPolicyNever:
		return false
	case corev1.ContainerRestartPolicyOnFailure:
		return code != 0
	}
	return true // Always, or unset: the API server defaults it to Always
}

// countedContainers are the containers whose exits decide the phase: the
// pod's containers and its init containers that are not sidecars.
func countedContainers(pod *corev1.Pod) []corev1.Container {
	init := slices.DeleteFunc(slices.Clone(pod.Spec.InitContainers), isSidecar)
	return slices.Concat(init, pod.Spec.Containers)
}

// isSidecar tells whether init container c is a native sidecar: one with
// restartPolicy Always.
func isSidecar(c corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// terminated is the state of the named container if it has exited, else
// nil.
func terminated(pod *corev1.Pod, name string) *corev1.ContainerStateTerminated {
	for _, s := range statuses(pod) {
		if s.Name == name {
			return s.State.Terminated
		}
	}
	return nil
}

func statuses(pod *corev1.Pod) []corev1.ContainerStatus {
	return slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses)
}

func isRunning(s corev1.ContainerStatus) bool { return s.State.Running != nil }

// CSIWrites lists the caches of the pod's namespace that its layercache
// CSI inline volumes may write (attribute cache, NAME or NAMESPACE/NAME;
// attribute mode other than read; a volume not mounted read-only). A
// build may commit to them until the node agent ends its volumes, so
// the manager keeps them: it knows no PV of such a volume. The agent
// validates the attributes; an invalid one names no cache here either
// way, as the agent refuses its volume.
func CSIWrites(pod *corev1.Pod) []string {
	var caches []string
	for _, v := range pod.Spec.Volumes {
		csi := v.CSI
		if csi == nil || csi.Driver != v1alpha1.CSIDriverName || (csi.ReadOnly != nil && *csi.ReadOnly) ||
			csi.VolumeAttributes[v1alpha1.CSIAttributeMode] == string(v1alpha1.ModeRead) {
			continue
		}
		name := csi.VolumeAttributes[v1alpha1.CSIAttributeCache]
		if ns, n, ok := strings.Cut(name, "/"); ok {
			if ns != pod.Namespace {
				continue // another namespace's cache is read-only
			}
			name = n
		}
		if name != "" && !slices.Contains(caches, name) {
			caches = append(caches, name)
		}
	}
	return caches
}
