package podfacts

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/storage/ephemeral"

	"github.com/layercache/layercache/api/v1alpha1"
)

// Container states in a pod's table: running, waiting, or exited with a
// code.
const (
	running = -1
	waiting = -2
)

// container is one container of a test pod and its state: running,
// waiting, or the code it exited with; noStatus leaves it unreported.
type container struct {
	name     string
	state    int32
	noStatus bool
	policy   corev1.ContainerRestartPolicy // "" for none of its own
	rules    bool                          // has restart rules
	noSpec   bool                          // only in the pod's status
}

type podSpec struct {
	phase     corev1.PodPhase
	policy    corev1.RestartPolicy
	init      []container
	main      []container
	ephemeral []container
}

func (p podSpec) pod() *corev1.Pod {
	pod := &corev1.Pod{
		Spec:   corev1.PodSpec{RestartPolicy: p.policy},
		Status: corev1.PodStatus{Phase: p.phase},
	}
	pod.Spec.InitContainers, pod.Status.InitContainerStatuses = containers(p.init)
	pod.Spec.Containers, pod.Status.ContainerStatuses = containers(p.main)
	for _, c := range p.ephemeral {
		if c.noSpec {
			continue
		}
		pod.Spec.EphemeralContainers = append(pod.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: c.name},
		})
	}
	_, pod.Status.EphemeralContainerStatuses = containers(p.ephemeral)
	return pod
}

func containers(cs []container) ([]corev1.Container, []corev1.ContainerStatus) {
	var specs []corev1.Container
	var statuses []corev1.ContainerStatus
	for _, c := range cs {
		spec := corev1.Container{Name: c.name}
		if c.policy != "" {
			spec.RestartPolicy = &c.policy
		}
		if c.rules {
			spec.RestartPolicyRules = []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart}}
		}
		specs = append(specs, spec)
		if !c.noStatus {
			statuses = append(statuses, corev1.ContainerStatus{Name: c.name, State: state(c.state)})
		}
	}
	return specs, statuses
}

func state(code int32) corev1.ContainerState {
	switch code {
	case running:
		return corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	case waiting:
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}
	}
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
}

// sidecar is a native sidecar in the given state; the kubelet kills it
// (137) once the pod's containers have exited.
func sidecar(state int32) container {
	return container{name: "proxy", state: state, policy: corev1.ContainerRestartPolicyAlways}
}

func regular(states ...int32) []container {
	names := []string{"build", "wait", "step"}
	var cs []container
	for i, s := range states {
		cs = append(cs, container{name: names[i], state: s})
	}
	return cs
}

func TestEndedAndFinalPhase(t *testing.T) {
	const (
		never      = corev1.RestartPolicyNever
		onFailure  = corev1.RestartPolicyOnFailure
		always     = corev1.RestartPolicyAlways
		succeeded  = corev1.PodSucceeded
		failed     = corev1.PodFailed
		podRunning = corev1.PodRunning
	)
	tests := []struct {
		name  string
		pod   podSpec
		ended bool
		final corev1.PodPhase
	}{
		// Phases.
		{"pending, nothing started", podSpec{phase: corev1.PodPending, policy: never, main: []container{{name: "build", state: waiting}}}, false, ""},
		{"running", podSpec{phase: podRunning, policy: never, main: regular(running)}, false, ""},
		{"succeeded", podSpec{phase: succeeded, policy: never, main: regular(0)}, true, succeeded},
		{"failed", podSpec{phase: failed, policy: never, main: regular(1)}, true, failed},
		{"terminal phase decides the outcome over exit codes", podSpec{phase: succeeded, policy: never, main: regular(1)}, true, succeeded},
		{"terminal without statuses", podSpec{phase: failed, policy: always, main: []container{{name: "build", noStatus: true}}}, true, failed},

		// A terminal phase set from outside (eviction, pod GC) while a
		// container still runs: it would write into the layer.
		{"succeeded, a container still runs", podSpec{phase: succeeded, policy: never, main: regular(0, running)}, false, succeeded},
		{"failed, a sidecar still runs", podSpec{phase: failed, policy: never, init: []container{sidecar(running)}, main: regular(1)}, false, failed},
		{"failed, an ephemeral container still runs", podSpec{phase: failed, policy: never, main: regular(1), ephemeral: []container{{name: "debug", state: running}}}, false, failed},
		{"succeeded, an init container still runs", podSpec{phase: succeeded, policy: never, init: []container{{name: "setup", state: running}}, main: regular(0)}, false, succeeded},

		// Restart policies, before the kubelet reports the phase.
		{"never: every container exited 0", podSpec{phase: podRunning, policy: never, main: regular(0, 0)}, true, succeeded},
		{"never: one container failed", podSpec{phase: podRunning, policy: never, main: regular(0, 2)}, true, failed},
		{"never: one container still runs", podSpec{phase: podRunning, policy: never, main: regular(0, running)}, false, ""},
		{"on-failure: every container exited 0", podSpec{phase: podRunning, policy: onFailure, main: regular(0)}, true, succeeded},
		{"on-failure: a failed container is restarted", podSpec{phase: podRunning, policy: onFailure, main: regular(0, 1)}, false, ""},
		{"always: containers are restarted", podSpec{phase: podRunning, policy: always, main: regular(0)}, false, ""},
		{"unset policy is always", podSpec{phase: podRunning, main: regular(0)}, false, ""},
		{"a container's own policy: always in a never pod", podSpec{phase: podRunning, policy: never,
			main: []container{{name: "build", state: 0}, {name: "agent", state: 0, policy: corev1.ContainerRestartPolicyAlways}}}, false, ""},
		{"a container's own policy: never in an on-failure pod", podSpec{phase: podRunning, policy: onFailure,
			main: []container{{name: "build", state: 3, policy: corev1.ContainerRestartPolicyNever}}}, true, failed},
		{"restart rules may restart any exit", podSpec{phase: podRunning, policy: never,
			main: []container{{name: "build", state: 0, policy: corev1.ContainerRestartPolicyNever, rules: true}}}, false, ""},

		// Missing statuses: a container not reported yet may still start.
		{"a container without a status", podSpec{phase: podRunning, policy: never, main: []container{{name: "build", state: 0}, {name: "wait", noStatus: true}}}, false, ""},
		{"a container waiting", podSpec{phase: podRunning, policy: never, main: regular(0, waiting)}, false, ""},
		{"a cut-down copy without the spec's containers", podSpec{phase: podRunning, policy: never, ephemeral: []container{{name: "debug", state: 0}}}, false, ""},
		{"a running container the spec does not list", podSpec{phase: podRunning, policy: never, main: regular(0), ephemeral: []container{{name: "debug", state: running, noSpec: true}}}, false, ""},
		{"no statuses at all", podSpec{phase: podRunning, policy: never, main: []container{{name: "build", noStatus: true}}}, false, ""},

		// Init containers.
		{"never: init container exited 0, containers exited", podSpec{phase: podRunning, policy: never, init: []container{{name: "setup", state: 0}}, main: regular(0)}, true, succeeded},
		{"never: init container failed, containers never start", podSpec{phase: podRunning, policy: never, init: []container{{name: "setup", state: 1}}, main: regular(waiting)}, false, ""},
		{"never: init container failed, pod failed", podSpec{phase: failed, policy: never, init: []container{{name: "setup", state: 1}}, main: regular(waiting)}, true, failed},
		{"on-failure: a failed init container is restarted", podSpec{phase: corev1.PodPending, policy: onFailure, init: []container{{name: "setup", state: 1}}, main: regular(waiting)}, false, ""},

		// Native sidecars.
		{"never: a sidecar killed after the build does not fail it", podSpec{phase: podRunning, policy: never, init: []container{sidecar(137)}, main: regular(0)}, true, succeeded},
		{"on-failure: a killed sidecar does not hold the end", podSpec{phase: podRunning, policy: onFailure, init: []container{sidecar(137)}, main: regular(0)}, true, succeeded},
		{"never: a sidecar still runs after the build", podSpec{phase: podRunning, policy: never, init: []container{sidecar(running)}, main: regular(0)}, false, ""},
		{"never: a killed sidecar does not hide a failed build", podSpec{phase: podRunning, policy: never, init: []container{sidecar(137)}, main: regular(2)}, true, failed},

		// Ordinary extra containers (Tekton sidecars, Argo's wait) count.
		{"never: argo's wait container failed", podSpec{phase: podRunning, policy: never, main: regular(0, 1)}, true, failed},

		// Ephemeral (debug) containers hold the end, but their exits do
		// not count.
		{"never: an ephemeral container still runs", podSpec{phase: podRunning, policy: never, main: regular(0), ephemeral: []container{{name: "debug", state: running}}}, false, ""},
		{"never: an ephemeral container exited 1", podSpec{phase: podRunning, policy: never, main: regular(0), ephemeral: []container{{name: "debug", state: 1}}}, true, succeeded},
		{"never: an ephemeral container not started yet", podSpec{phase: podRunning, policy: never, main: regular(0), ephemeral: []container{{name: "debug", noStatus: true}}}, false, ""},
	}
	for _, tt := range tests {
		pod := tt.pod.pod()
		if got := Ended(pod); got != tt.ended {
			t.Errorf("%s: Ended = %v, want %v", tt.name, got, tt.ended)
		}
		if got := FinalPhase(pod); got != tt.final {
			t.Errorf("%s: FinalPhase = %q, want %q", tt.name, got, tt.final)
		}
	}
}

func TestTerminal(t *testing.T) {
	for phase, want := range map[corev1.PodPhase]bool{
		"": false, corev1.PodPending: false, corev1.PodRunning: false, corev1.PodUnknown: false,
		corev1.PodSucceeded: true, corev1.PodFailed: true,
	} {
		if got := Terminal(&corev1.Pod{Status: corev1.PodStatus{Phase: phase}}); got != want {
			t.Errorf("Terminal(%q) = %v, want %v", phase, got, want)
		}
	}
}

func TestClaims(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "build"},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "ws", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "workspace"}}},
		}},
	}
	// The ephemeral-volume controller's own naming, which Claims repeats
	// to import only k8s.io/api and apimachinery.
	scratch := ephemeral.VolumeClaimName(pod, &pod.Spec.Volumes[0])
	want := []Claim{{Volume: "scratch", Name: scratch, Owned: true}, {Volume: "ws", Name: "workspace"}}
	got := Claims(pod)
	if len(got) != len(want) {
		t.Fatalf("Claims = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Claims[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestOwningPod(t *testing.T) {
	controller := true
	tests := []struct {
		name string
		refs []metav1.OwnerReference
		want string // the owning pod's name, "" for none
	}{
		{"standalone", nil, ""},
		{"generic ephemeral volume", []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "build", Controller: &controller}}, "build"},
		{"owned but not controlled", []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "build"}}, ""},
		{"controlled by something else", []metav1.OwnerReference{{APIVersion: "tekton.dev/v1", Kind: "PipelineRun", Name: "run", Controller: &controller}}, ""},
		{"a Pod of another group", []metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Pod", Name: "build", Controller: &controller}}, ""},
	}
	for _, tt := range tests {
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{OwnerReferences: tt.refs}}
		ref, ok := OwningPod(claim)
		switch {
		case ok != (tt.want != ""):
			t.Errorf("%s: OwningPod ok = %v, want %v", tt.name, ok, tt.want != "")
		case ok && ref.Name != tt.want:
			t.Errorf("%s: OwningPod = %s, want %s", tt.name, ref.Name, tt.want)
		}
	}
}

func TestCSIWrites(t *testing.T) {
	csi := func(attrs map[string]string, readOnly bool) corev1.Volume {
		return corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: v1alpha1.CSIDriverName, VolumeAttributes: attrs, ReadOnly: &readOnly}}}
	}
	tests := []struct {
		name    string
		volumes []corev1.Volume
		want    []string
	}{
		{"a cache of the pod's namespace", []corev1.Volume{csi(map[string]string{"cache": "maven"}, false)}, []string{"maven"}},
		{"named with the pod's namespace", []corev1.Volume{csi(map[string]string{"cache": "builds/maven", "mode": "write"}, false)}, []string{"maven"}},
		{"twice", []corev1.Volume{csi(map[string]string{"cache": "maven"}, false), csi(map[string]string{"cache": "maven"}, false)}, []string{"maven"}},
		{"mode read", []corev1.Volume{csi(map[string]string{"cache": "maven", "mode": "read"}, false)}, nil},
		{"mounted read-only", []corev1.Volume{csi(map[string]string{"cache": "maven"}, true)}, nil},
		{"another namespace's cache", []corev1.Volume{csi(map[string]string{"cache": "team/maven"}, false)}, nil},
		{"no cache", []corev1.Volume{csi(map[string]string{}, false)}, nil},
		{"another driver", []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: "example.com", VolumeAttributes: map[string]string{"cache": "maven"}}}}}, nil},
	}
	for _, tt := range tests {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "builds", Name: "build"}, Spec: corev1.PodSpec{Volumes: tt.volumes}}
		if got := CSIWrites(pod); !slices.Equal(got, tt.want) {
			t.Errorf("%s: CSIWrites = %q, want %q", tt.name, got, tt.want)
		}
	}
}
