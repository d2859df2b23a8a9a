package volumes

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
	"github.com/layercache/layercache/podfacts"
)

const (
	buildPod   = kittest.BuildPod
	buildClaim = "ci/" + buildPod + "-cache"
)

// sharer is another pod of the node that names the claim directly.
func sharer(phase corev1.PodPhase, running bool) *corev1.Pod {
	pod := kittest.EphemeralPod("sharer", phase, running)
	pod.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: buildPod + "-cache"}}
	return pod
}

// exited is a pod whose containers have exited with the given codes (a
// negative code: still running) while the kubelet still reports it
// Running, under restartPolicy policy.
func exited(policy corev1.RestartPolicy, codes ...int32) *corev1.Pod {
	pod := kittest.EphemeralPod("p", corev1.PodRunning, false)
	pod.Spec.RestartPolicy = policy
	pod.Status.ContainerStatuses = nil
	pod.Spec.Containers = nil
	for i, code := range codes {
		name := fmt.Sprintf("c%d", i)
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: name})
		state := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
		if code < 0 {
			state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		}
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: name, State: state})
	}
	return pod
}

// withSidecar adds a restartable init container that the kubelet stopped
// with SIGKILL after the pod's containers exited.
func withSidecar(pod *corev1.Pod) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	pod.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: &always}}
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 137},
	}}}
	return pod
}

func TestPodEnded(t *testing.T) {
	tests := []struct {
		name    string
		pod     *corev1.Pod
		ended   bool
		outcome string
	}{
		{"running", kittest.EphemeralPod("p", corev1.PodRunning, true), false, ""},
		{"succeeded", kittest.EphemeralPod("p", corev1.PodSucceeded, false), true, v1alpha1.OutcomeSucceeded},
		{"failed", kittest.EphemeralPod("p", corev1.PodFailed, false), true, v1alpha1.OutcomeFailed},
		// A container still running would write into the layer.
		{"succeeded with a container still running", kittest.EphemeralPod("p", corev1.PodSucceeded, true), false, v1alpha1.OutcomeSucceeded},
		{"pending", kittest.EphemeralPod("p", corev1.PodPending, false), false, ""},
		// The kubelet reports the exits a second before the phase.
		{"never: every container exited 0", exited(corev1.RestartPolicyNever, 0, 0), true, v1alpha1.OutcomeSucceeded},
		{"never: one container failed", exited(corev1.RestartPolicyNever, 0, 2), true, v1alpha1.OutcomeFailed},
		{"never: one container still runs", exited(corev1.RestartPolicyNever, 0, -1), false, ""},
		{"on-failure: every container exited 0", exited(corev1.RestartPolicyOnFailure, 0), true, v1alpha1.OutcomeSucceeded},
		{"on-failure: a failed container is restarted", exited(corev1.RestartPolicyOnFailure, 1), false, ""},
		{"always: containers are restarted", exited(corev1.RestartPolicyAlways, 0), false, ""},
		{"never: a sidecar killed after the build does not fail it", withSidecar(exited(corev1.RestartPolicyNever, 0)), true, v1alpha1.OutcomeSucceeded},
		{"on-failure: a killed sidecar does not hold the end", withSidecar(exited(corev1.RestartPolicyOnFailure, 0)), true, v1alpha1.OutcomeSucceeded},
	}
	for _, tt := range tests {
		if got := podfacts.Ended(tt.pod); got != tt.ended {
			t.Errorf("%s: podEnded = %v, want %v", tt.name, got, tt.ended)
		}
		if got := podOutcome(tt.pod); got != tt.outcome {
			t.Errorf("%s: podOutcome = %q, want %q", tt.name, got, tt.outcome)
		}
	}
}

// buildEndEnv provisions the ephemeral claim of buildPod on a fake store
// and wires buildEnds over indexers that hold the given pods.
type buildEndEnv struct {
	*testEnv
	ends *buildEnds
	kube *fake.Clientset
	pv   *corev1.PersistentVolume
	// claimIdx and pvIdx back the listers, as the informers' stores do.
	claimIdx, pvIdx cache.Indexer
	claim           *corev1.PersistentVolumeClaim
}

func newBuildEndEnv(t *testing.T, ann map[string]string, owned bool, pods ...*corev1.Pod) *buildEndEnv {
	t.Helper()
	env := newTestEnv(t, nil)
	opts := provisionOptions("ci", ann, nil)
	opts.PVC.Name = buildPod + "-cache"
	if owned {
		opts.PVC.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: buildPod, UID: "uid-" + buildPod, Controller: new(true)}}
	}
	pv, _, err := env.prov.Provision(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ci", Name: opts.PVC.Name, UID: opts.PVC.UID}
	pv.Status.Phase = corev1.VolumeBound
	env.drainEvents()

	opts.PVC.Spec.VolumeName = pv.Name
	pvs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	claims := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	podIndex := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{indexClaim: podClaims})
	must(t, pvs.Add(pv))
	must(t, claims.Add(opts.PVC))
	for _, p := range pods {
		must(t, podIndex.Add(p))
	}
	kube := fake.NewClientset(pv.DeepCopy())
	kube.ClearActions()
	ends := &buildEnds{
		prov: env.prov, kube: kube, pods: podIndex, claims: corelisters.NewPersistentVolumeClaimLister(claims),
		pvs: corelisters.NewPersistentVolumeLister(pvs), queue: kit.NewKeyQueue("build-end"), seen: env.prov.seen,
	}
	t.Cleanup(ends.queue.ShutDown)
	return &buildEndEnv{testEnv: env, ends: ends, kube: kube, pv: pv, claimIdx: claims, pvIdx: pvs, claim: opts.PVC}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestBuildEnd(t *testing.T) {
	maven := map[string]string{v1alpha1.AnnotationCache: "maven"}
	onMarker := map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: string(v1alpha1.CommitOnMarker)}
	tests := []struct {
		name    string
		ann     map[string]string
		owned   bool
		pods    []*corev1.Pod
		seen    string   // outcome remembered for a pod that went away
		control []string // control files the build wrote
		want    string   // result on the PV; "" when the volume stays
		event   string   // the Event on the claim
	}{
		{name: "owner succeeded: committed", ann: maven, owned: true,
			pods: []*corev1.Pod{kittest.EphemeralPod(buildPod, corev1.PodSucceeded, false)},
			want: v1alpha1.ResultCommitted, event: "Normal Committed"},
		{name: "owner failed: discarded", ann: maven, owned: true,
			pods: []*corev1.Pod{kittest.EphemeralPod(buildPod, corev1.PodFailed, false)},
			want: v1alpha1.ResultDiscarded, event: "Normal Discarded"},
		{name: "owner still running: kept", ann: maven, owned: true,
			pods: []*corev1.Pod{kittest.EphemeralPod(buildPod, corev1.PodRunning, true)}},
		{name: "owner ended but a container runs: kept", ann: maven, owned: true,
			pods: []*corev1.Pod{kittest.EphemeralPod(buildPod, corev1.PodSucceeded, true)}},
		{name: "another pod of the node still uses the claim: kept", ann: maven, owned: true,
			pods: []*corev1.Pod{kittest.EphemeralPod(buildPod, corev1.PodSucceeded, false), sharer(corev1.PodRunning, true)}},
		{name: "owner went away after it succeeded: committed", ann: maven, owned: true,
			seen: v1alpha1.OutcomeSucceeded, want: v1alpha1.ResultCommitted, event: "Normal Committed"},
		{name: "owner went away unseen: outcome unknown, discarded", ann: maven, owned: true,
			want: v1alpha1.ResultDiscarded, event: "Normal Discarded"},
		{name: "on-marker, marker written, pod deleted at once: committed", ann: onMarker, owned: true,
			control: []string{"commit"}, want: v1alpha1.ResultCommitted, event: "Normal Committed"},
		{name: "on-marker, pod failed but wrote the marker: committed", ann: onMarker, owned: true,
			pods: []*corev1.Pod{kittest.EphemeralPod(buildPod, corev1.PodFailed, false)}, control: []string{"commit"},
			want: v1alpha1.ResultCommitted, event: "Normal Committed"},
		{name: "on-marker, no marker: discarded", ann: onMarker, owned: true,
			pods: []*corev1.Pod{kittest.EphemeralPod(buildPod, corev1.PodSucceeded, false)},
			want: v1alpha1.ResultDiscarded, event: "Normal Discarded"},
		{name: "on-marker, abort wins: discarded", ann: onMarker, owned: true,
			pods: []*corev1.Pod{kittest.EphemeralPod(buildPod, corev1.PodSucceeded, false)}, control: []string{"commit", "abort"},
			want: v1alpha1.ResultDiscarded, event: "Normal Discarded"},
		{name: "standalone claim: ends at release, not here", ann: maven,
			pods: []*corev1.Pod{sharer(corev1.PodSucceeded, false)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newBuildEndEnv(t, tt.ann, tt.owned, tt.pods...)
			env.store.Control[env.pv.Name] = tt.control
			if tt.seen != "" {
				env.prov.seen.set(buildClaim, tt.seen)
			}
			ctx := context.Background()
			must(t, env.ends.end(ctx, buildClaim))

			acted := len(env.store.Commits) + len(env.store.Discards)
			patches := len(env.kube.Actions())
			if tt.want == "" {
				if acted != 0 || patches != 0 {
					t.Fatalf("volume ended (commits %v, discards %v, API actions %v), want it kept", env.store.Commits, env.store.Discards, env.kube.Actions())
				}
				return
			}
			if patches != 1 {
				t.Fatalf("API actions %v, want one PV patch", env.kube.Actions())
			}
			pv, err := env.kube.CoreV1().PersistentVolumes().Get(ctx, env.pv.Name, metav1.GetOptions{})
			must(t, err)
			if got := pv.Annotations[v1alpha1.AnnotationResult]; got != tt.want {
				t.Errorf("PV result %q, want %q", got, tt.want)
			}
			if tt.want == v1alpha1.ResultCommitted && pv.Annotations[v1alpha1.AnnotationCommittedGeneration] != "1" {
				t.Errorf("PV committed generation %q, want 1", pv.Annotations[v1alpha1.AnnotationCommittedGeneration])
			}
			env.wantEvent(t, tt.event, env.pv.Name)
			if got := metricValue(t, env.prov.metrics.Ends.WithLabelValues(tt.want, triggerPod)); got != 1 {
				t.Errorf("layercache_volume_ends_total{result=%q,trigger=pod} = %v, want 1", tt.want, got)
			}

			// The agent restarts and sees the kept pod again: the volume is
			// gone, so nothing is done and nothing is written.
			env.kube.ClearActions()
			must(t, env.ends.end(ctx, buildClaim))
			if acted2 := len(env.store.Commits) + len(env.store.Discards); acted2 != acted || len(env.kube.Actions()) != 0 {
				t.Errorf("a second end acted again: commits %v discards %v, API actions %v", env.store.Commits, env.store.Discards, env.kube.Actions())
			}
		})
	}
}

// A pod that goes away queues its volume with the outcome it last showed,
// and Delete, when the claim follows the pod, ends the volume the same way.
func TestBuildEndPodGoneThenReleased(t *testing.T) {
	pod := kittest.EphemeralPod(buildPod, corev1.PodSucceeded, false)
	env := newBuildEndEnv(t, map[string]string{v1alpha1.AnnotationCache: "maven"}, true)
	env.ends.handlers().OnDelete(cache.DeletedFinalStateUnknown{Key: "ci/" + buildPod, Obj: pod})
	if env.ends.queue.Len() != 1 {
		t.Fatalf("queue length %d after the pod went away, want 1", env.ends.queue.Len())
	}
	released := env.pv.DeepCopy()
	released.Status.Phase = corev1.VolumeReleased
	must(t, env.prov.Delete(context.Background(), released))
	if len(env.store.Commits) != 1 {
		t.Errorf("commits %v, want the volume committed as its pod succeeded", env.store.Commits)
	}
}

// Regression: at the agent's start the pod informer delivered a kept,
// ended pod before the claim and PV informers had listed, and the pod's
// volume was not ended until something else touched the pod. Pod events
// only queue the claim; the worker looks it up.
func TestBuildEndPodSeenBeforeItsClaim(t *testing.T) {
	pod := kittest.EphemeralPod(buildPod, corev1.PodSucceeded, false)
	env := newBuildEndEnv(t, map[string]string{v1alpha1.AnnotationCache: "maven"}, true, pod)
	must(t, env.claimIdx.Delete(env.claim))
	must(t, env.pvIdx.Delete(env.pv))
	env.ends.handlers().OnAdd(pod, true)
	if env.ends.queue.Len() != 1 {
		t.Fatalf("queue length %d after an ended pod was listed before its claim and PV, want 1", env.ends.queue.Len())
	}
	// The workers start once every informer has synced.
	must(t, env.claimIdx.Add(env.claim))
	must(t, env.pvIdx.Add(env.pv))
	must(t, env.ends.end(context.Background(), buildClaim))
	if len(env.store.Commits) != 1 {
		t.Errorf("commits %v, want the volume committed", env.store.Commits)
	}
}
