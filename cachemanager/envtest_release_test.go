//go:build envtest

package cachemanager

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-helpers/storage/ephemeral"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// testNode is the node the tests' pods "run" on. No Node object is needed
// for pods: nothing schedules them.
const testNode = "node-a"

// claimSpec is the spec of a layercache claim as a build chart writes it.
func claimSpec(class string) corev1.PersistentVolumeClaimSpec {
	return corev1.PersistentVolumeClaimSpec{
		StorageClassName: &class,
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources: corev1.VolumeResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		},
	}
}

// createClaim creates a claim of class layercache that names cache maven;
// mutate may change it first.
func (a *apiTest) createClaim(name string, mutate ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	a.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: a.ns,
			Annotations: map[string]string{v1alpha1.AnnotationCache: "maven"},
		},
		Spec: claimSpec(v1alpha1.StorageClassName),
	}
	for _, m := range mutate {
		m(pvc)
	}
	if err := a.c.Create(a.ctx, pvc); err != nil {
		a.t.Fatalf("creating claim %s: %v", name, err)
	}
	return pvc
}

func releasable(pvc *corev1.PersistentVolumeClaim) {
	pvc.Annotations[v1alpha1.AnnotationRelease] = v1alpha1.ReleaseOnPodExit
}

// ownedByPod makes the claim one that pod controls, as the ephemeral-volume
// controller (or a CI plugin that makes a claim per pod) does.
func ownedByPod(pod *corev1.Pod) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) {
		yes := true
		pvc.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: &yes, BlockOwnerDeletion: &yes,
		}}
	}
}

// bind does what the node agent's provisioner and the PV controller do for
// a claim: a layercache PV bound to it, and the claim bound to the PV.
func (a *apiTest) bind(pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	a.t.Helper()
	var class storagev1.StorageClass
	if err := a.c.Get(a.ctx, types.NamespacedName{Name: *pvc.Spec.StorageClassName}, &class); err != nil {
		a.t.Fatalf("reading the class of claim %s: %v", pvc.Name, err)
	}
	annotations := map[string]string{annProvisionedBy: class.Provisioner}
	if class.Provisioner == v1alpha1.ProvisionerName {
		annotations[v1alpha1.AnnotationNode] = testNode
		annotations[v1alpha1.AnnotationCache] = a.ns + "/maven"
	}
	hostPathType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "pvc-" + string(pvc.UID),
			Annotations: annotations,
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      pvc.Spec.Resources.Requests,
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              *pvc.Spec.StorageClassName,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/layercache/volumes/" + string(pvc.UID) + "/merged", Type: &hostPathType},
			},
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
			},
		},
	}
	if err := a.c.Create(a.ctx, pv); err != nil {
		a.t.Fatalf("creating PV for claim %s: %v", pvc.Name, err)
	}
	a.clusterScoped = append(a.clusterScoped, pv)
	pv.Status.Phase = corev1.VolumeBound
	if err := a.c.Status().Update(a.ctx, pv); err != nil {
		a.t.Fatalf("binding PV %s: %v", pv.Name, err)
	}

	if err := a.rewrite(pvc, func() error {
		pvc.Spec.VolumeName = pv.Name
		metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, "pv.kubernetes.io/bind-completed", "yes")
		metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, annStorageProvisioner, class.Provisioner)
		return a.c.Update(a.ctx, pvc)
	}); err != nil {
		a.t.Fatalf("binding claim %s to %s: %v", pvc.Name, pv.Name, err)
	}
	if err := a.rewrite(pvc, func() error {
		pvc.Status.Phase = corev1.ClaimBound
		pvc.Status.AccessModes = pv.Spec.AccessModes
		pvc.Status.Capacity = pv.Spec.Capacity
		return a.c.Status().Update(a.ctx, pvc)
	}); err != nil {
		a.t.Fatalf("setting claim %s Bound: %v", pvc.Name, err)
	}
	return pv
}

// rewrite reads obj again and makes write, again while it conflicts: the
// manager writes claims and pods too (its finalizers), as in a cluster,
// where their other writers (the binder, the kubelet) start again likewise.
func (a *apiTest) rewrite(obj client.Object, write func() error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := a.get(a.ctx, obj); err != nil {
			return err
		}
		return write()
	})
}

// claimVolume names a standalone claim in a pod.
func claimVolume(claim string) corev1.Volume {
	return corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}
}

// ephemeralVolume is a generic ephemeral volume of class layercache.
func ephemeralVolume(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
		VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationCache: "maven"}},
			Spec:       claimSpec(v1alpha1.StorageClassName),
		},
	}}}
}

// createPod creates a pod on testNode with the given volumes and starts it:
// phase Running, a start time and a running container, as a kubelet
// reports them.
func (a *apiTest) createPod(name string, volumes ...corev1.Volume) *corev1.Pod {
	a.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: a.ns},
		Spec: corev1.PodSpec{
			NodeName:      testNode,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "build", Image: "localhost/busybox:e2e",
				VolumeMounts: mounts(volumes),
			}},
			Volumes: volumes,
		},
	}
	if err := a.c.Create(a.ctx, pod); err != nil {
		a.t.Fatalf("creating pod %s: %v", name, err)
	}
	now := metav1.Now()
	if err := a.rewrite(pod, func() error {
		pod.Status = corev1.PodStatus{
			Phase:     corev1.PodRunning,
			StartTime: &now,
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "build", Image: "localhost/busybox:e2e", Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			}},
		}
		return a.c.Status().Update(a.ctx, pod)
	}); err != nil {
		a.t.Fatalf("starting pod %s: %v", name, err)
	}
	return pod
}

func mounts(volumes []corev1.Volume) []corev1.VolumeMount {
	var out []corev1.VolumeMount
	for _, v := range volumes {
		out = append(out, corev1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
	}
	return out
}

// endPod reports the pod's end as a kubelet does: its container
// terminated, then the terminal phase.
func (a *apiTest) endPod(pod *corev1.Pod, phase corev1.PodPhase) {
	a.t.Helper()
	exit := int32(0)
	if phase == corev1.PodFailed {
		exit = 1
	}
	now := metav1.Now()
	if err := a.rewrite(pod, func() error {
		pod.Status.Phase = phase
		pod.Status.ContainerStatuses[0].Ready = false
		pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: exit, StartedAt: *pod.Status.StartTime, FinishedAt: now,
		}}
		return a.c.Status().Update(a.ctx, pod)
	}); err != nil {
		a.t.Fatalf("ending pod %s as %s: %v", pod.Name, phase, err)
	}
}

// outcomeIs reports nil once the PV's pod-outcome annotation is want.
func (a *apiTest) outcomeIs(pv *corev1.PersistentVolume, want string) func(context.Context) error {
	return func(ctx context.Context) error {
		var cur corev1.PersistentVolume
		if err := a.c.Get(ctx, client.ObjectKeyFromObject(pv), &cur); err != nil {
			return err
		}
		if got := cur.Annotations[v1alpha1.AnnotationPodOutcome]; got != want {
			return fmt.Errorf("PV %s outcome %q, want %q", pv.Name, got, want)
		}
		return nil
	}
}

// hasFinalizers reports nil once the object's finalizers are exactly want
// (in any order).
func (a *apiTest) hasFinalizers(obj client.Object, want ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		cur := obj.DeepCopyObject().(client.Object)
		if err := a.get(ctx, cur); err != nil {
			return err
		}
		got := slices.Sorted(slices.Values(cur.GetFinalizers()))
		if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			return fmt.Errorf("%s finalizers %v, want %v", cur.GetName(), got, want)
		}
		return nil
	}
}

func claimPath(pvc *corev1.PersistentVolumeClaim) string {
	return "/api/v1/namespaces/" + pvc.Namespace + "/persistentvolumeclaims/" + pvc.Name
}

func pvPath(pv *corev1.PersistentVolume) string { return "/api/v1/persistentvolumes/" + pv.Name }

// TestEnvtestRelease follows one claim through one build pod: how the pod
// ends and who owns the claim decide what the manager writes.
func TestEnvtestRelease(t *testing.T) {
	type owner int
	const (
		standalone   owner = iota
		podClaim           // owned by its pod, named by a persistentVolumeClaim volume (a CI plugin's claim per pod)
		podEphemeral       // a generic ephemeral volume's claim
	)
	tests := []struct {
		name  string
		owner owner
		claim func(*corev1.PersistentVolumeClaim)
		// lateManager starts the manager only after the pod ended: a pod
		// that ended while the manager was down comes as a create event.
		lateManager bool
		phase       corev1.PodPhase
		outcome     string // on the PV afterwards
		released    bool   // the claim is deleted and gone
		untouched   bool   // the manager writes nothing about the claim or its PV
	}{{
		name:    "standalone claim: a succeeded pod's outcome is recorded, the claim kept",
		phase:   corev1.PodSucceeded,
		outcome: v1alpha1.OutcomeSucceeded,
	}, {
		name:    "standalone claim: a failed pod's outcome is recorded, the claim kept",
		phase:   corev1.PodFailed,
		outcome: v1alpha1.OutcomeFailed,
	}, {
		name:     "releasable claim is deleted after its pod succeeds",
		claim:    releasable,
		phase:    corev1.PodSucceeded,
		outcome:  v1alpha1.OutcomeSucceeded,
		released: true,
	}, {
		name:     "releasable claim is deleted after its pod fails",
		claim:    releasable,
		phase:    corev1.PodFailed,
		outcome:  v1alpha1.OutcomeFailed,
		released: true,
	}, {
		name:        "releasable claim whose pod ended while the manager was down",
		claim:       releasable,
		lateManager: true,
		phase:       corev1.PodSucceeded,
		outcome:     v1alpha1.OutcomeSucceeded,
		released:    true,
	}, {
		// Regression: deleting the claim of a kept Job pod made the
		// ephemeral-volume controller recreate it, over and over.
		name:      "a generic ephemeral claim is its pod's: nothing written when the pod succeeds",
		owner:     podEphemeral,
		phase:     corev1.PodSucceeded,
		untouched: true,
	}, {
		name:      "a generic ephemeral claim is its pod's even when annotated for release",
		owner:     podEphemeral,
		claim:     releasable,
		phase:     corev1.PodFailed,
		untouched: true,
	}, {
		name:      "a pod-owned claim named by a PVC volume is its pod's even when annotated for release",
		owner:     podClaim,
		claim:     releasable,
		phase:     corev1.PodSucceeded,
		untouched: true,
	}, {
		name: "a claim of another provisioner is not layercache's",
		claim: func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Spec.StorageClassName = ptrTo("standard")
			delete(pvc.Annotations, v1alpha1.AnnotationCache)
			releasable(pvc)
		},
		phase:     corev1.PodSucceeded,
		untouched: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPITest(t)
			if !tc.lateManager {
				a.startManager()
			}
			mutate := []func(*corev1.PersistentVolumeClaim){}
			if tc.claim != nil {
				mutate = append(mutate, tc.claim)
			}

			// The claim, its PV and its pod, in the order the cluster makes
			// them: a pod-owned claim after its pod.
			var pvc *corev1.PersistentVolumeClaim
			var pod *corev1.Pod
			switch tc.owner {
			case standalone:
				pvc = a.createClaim("ws", mutate...)
				pod = a.createPod("build", claimVolume(pvc.Name))
			case podClaim:
				pod = a.createPod("build", claimVolume("build-cache"))
				pvc = a.createClaim("build-cache", append(mutate, ownedByPod(pod))...)
			case podEphemeral:
				vol := ephemeralVolume("cache")
				pod = a.createPod("build", vol)
				pvc = a.createClaim(ephemeral.VolumeClaimName(pod, &vol), append(mutate, ownedByPod(pod))...)
				if err := ephemeral.VolumeIsForPod(pod, pvc); err != nil {
					t.Fatalf("test setup: %v", err)
				}
			}
			pv := a.bind(pvc)
			if err := a.get(a.ctx, pvc); err != nil {
				t.Fatal(err)
			}
			rvBefore := pvc.ResourceVersion
			a.endPod(pod, tc.phase)
			if tc.lateManager {
				a.startManager()
			}

			if tc.untouched {
				// A standalone claim whose pod ends after the pod under
				// test: once its outcome is recorded, the manager has seen
				// every event about the claim under test too.
				sentinel := a.createClaim("sentinel")
				sentinelPod := a.createPod("sentinel", claimVolume(sentinel.Name))
				sentinelPV := a.bind(sentinel)
				a.endPod(sentinelPod, corev1.PodSucceeded)
				a.eventually("the sentinel's outcome", a.outcomeIs(sentinelPV, v1alpha1.OutcomeSucceeded))
				a.stays("the manager must not write the claim or its PV", func(ctx context.Context) error {
					if w := append(a.writes.to(claimPath(pvc)), a.writes.to(pvPath(pv))...); len(w) > 0 {
						return fmt.Errorf("manager wrote %q", w)
					}
					cur := pvc.DeepCopy()
					if err := a.get(ctx, cur); err != nil {
						return fmt.Errorf("claim: %w", err)
					}
					if cur.ResourceVersion != rvBefore || !cur.DeletionTimestamp.IsZero() {
						return fmt.Errorf("claim changed: resourceVersion %s, was %s; deleting %v; finalizers %v", cur.ResourceVersion, rvBefore, !cur.DeletionTimestamp.IsZero(), cur.Finalizers)
					}
					return nil
				})
				if evs, err := a.events(a.ctx, "PersistentVolumeClaim", pvc.Name); err != nil || len(evs) > 0 {
					t.Errorf("events about the claim: %q, %v; want none", evs, err)
				}
				return
			}

			a.eventually("the pod's outcome on the PV", a.outcomeIs(pv, tc.outcome))
			a.waitEvent("PersistentVolumeClaim", pvc.Name, "Normal OutcomeRecorded Recorded pod outcome "+tc.outcome+" on PersistentVolume "+pv.Name+" (pod build "+strings.ToLower(string(tc.phase))+")")
			if got := a.counter("layercache_manager_recorded_outcomes_total", tc.outcome); got != 1 {
				t.Errorf("recorded outcomes %s = %v, want 1", tc.outcome, got)
			}
			if tc.released {
				// Deleted, then both finalizers lifted: the API server's
				// pvc-protection (the pod object still exists) and the
				// manager's own.
				a.eventually("the claim released and gone", a.gone(pvc))
				a.waitEvent("PersistentVolumeClaim", pvc.Name, "Normal Released Deleted the claim: every pod that used it has ended (outcome "+tc.outcome)
				if got := a.counter("layercache_manager_released_claims_total", tc.outcome); got != 1 {
					t.Errorf("released claims %s = %v, want 1", tc.outcome, got)
				}
				return
			}
			// Kept for the next attempt, with the outcome finalizer beside
			// the API server's pvc-protection.
			a.stays("a claim without the release annotation is kept", func(ctx context.Context) error {
				cur := pvc.DeepCopy()
				if err := a.get(ctx, cur); err != nil {
					return err
				}
				if !cur.DeletionTimestamp.IsZero() {
					return fmt.Errorf("claim is being deleted")
				}
				return a.hasFinalizers(pvc, finalizerPVCProtection, v1alpha1.FinalizerOutcome)(ctx)
			})
		})
	}
}

// A standalone claim that the user deletes is held by the manager's
// finalizer while its pod runs (the API server's pvc-protection would hold
// it too, but owners such as Tekton lift that themselves), and finished
// once the pod ends, with the outcome on the PV before the claim goes.
//
// Regression (Tekton, coschedule: pipelineruns): Tekton deleted the
// workspace claim and lifted pvc-protection while its affinity assistant
// pod still held it, and the volume ended before the outcome was recorded.
func TestEnvtestOutcomeFinalizerHoldsAPurgedClaim(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	pvc := a.createClaim("ws")
	assistant := a.createPod("affinity-assistant-0", claimVolume(pvc.Name))
	pv := a.bind(pvc)
	a.eventually("the outcome finalizer on the claim", a.hasFinalizers(pvc, finalizerPVCProtection, v1alpha1.FinalizerOutcome))

	build := a.createPod("run-build-pod", claimVolume(pvc.Name))
	a.endPod(build, corev1.PodSucceeded)
	a.eventually("the build's outcome while the assistant still runs", a.outcomeIs(pv, v1alpha1.OutcomeSucceeded))

	// Tekton deletes the claim at completion and lifts pvc-protection.
	if err := a.get(a.ctx, pvc); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Delete(a.ctx, pvc); err != nil {
		t.Fatalf("deleting the claim: %v", err)
	}
	if err := a.get(a.ctx, pvc); err != nil {
		t.Fatalf("reading the deleted claim: %v", err)
	}
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	pvc.Finalizers = slices.DeleteFunc(pvc.Finalizers, func(f string) bool { return f == finalizerPVCProtection })
	if err := a.c.Patch(a.ctx, pvc, patch); err != nil {
		t.Fatalf("lifting pvc-protection as Tekton does: %v", err)
	}
	a.stays("the claim is held while the assistant runs", a.hasFinalizers(pvc, v1alpha1.FinalizerOutcome))

	a.endPod(assistant, corev1.PodSucceeded)
	a.eventually("the claim gone once every pod ended", a.gone(pvc))
	if err := a.outcomeIs(pv, v1alpha1.OutcomeSucceeded)(a.ctx); err != nil {
		t.Error(err)
	}
}

// A releasable claim whose pods were deleted before they were seen to end
// is released without an outcome, once the API server (not only the
// informer cache) confirms that no pod uses it.
func TestEnvtestReleaseWithoutPods(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	pvc := a.createClaim("ws", releasable)
	pod := a.createPod("build", claimVolume(pvc.Name))
	pv := a.bind(pvc)
	a.eventually("the outcome finalizer on the claim", a.hasFinalizers(pvc, finalizerPVCProtection, v1alpha1.FinalizerOutcome))

	if err := a.c.Delete(a.ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatalf("force-deleting the running pod: %v", err)
	}
	a.eventually("the claim released and gone", a.gone(pvc))
	a.waitEvent("PersistentVolumeClaim", pvc.Name, "Normal Released Deleted the claim: its pods were deleted before they were seen to end")
	if err := a.outcomeIs(pv, "")(a.ctx); err != nil {
		t.Error(err)
	}
	if got := a.counter("layercache_manager_released_claims_total", outcomeUnknown); got != 1 {
		t.Errorf("released claims %s = %v, want 1", outcomeUnknown, got)
	}
}

// A pipeline that makes a claim of the same name for every run: the
// completed pod of run 1 is kept, and names the claim that run 2 creates
// again. It must neither decide run 2's outcome nor release run 2's claim
// before run 2's own pod has ended (a release there would delete the claim
// under a pod about to use it).
func TestEnvtestRecreatedClaimIsNotReleasedByAnEarlierPod(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	first := a.createClaim("ws", releasable)
	run1 := a.createPod("run-1", claimVolume("ws"))
	pv1 := a.bind(first)
	a.endPod(run1, corev1.PodSucceeded)
	a.eventually("run 1's claim released", a.gone(first))

	// The API server keeps times in whole seconds; a real build pod runs
	// longer than that, so the new claim is created after run 1's start
	// second.
	if err := a.get(a.ctx, run1); err != nil {
		t.Fatal(err)
	}
	a.eventually("a new second after run 1 started", func(context.Context) error {
		if !time.Now().Truncate(time.Second).After(run1.Status.StartTime.Time) {
			return fmt.Errorf("still in run 1's start second")
		}
		return nil
	})

	second := a.createClaim("ws", releasable)
	if second.UID == first.UID {
		t.Fatalf("the new claim has the old UID %s", first.UID)
	}
	a.eventually("the new claim held for its outcome", a.hasFinalizers(second, finalizerPVCProtection, v1alpha1.FinalizerOutcome))
	kept := func(ctx context.Context) error {
		cur := second.DeepCopy()
		if err := a.get(ctx, cur); err != nil {
			return fmt.Errorf("new claim: %w", err)
		}
		if cur.UID != second.UID || !cur.DeletionTimestamp.IsZero() {
			return fmt.Errorf("new claim deleted or replaced (UID %s, deleting %v)", cur.UID, !cur.DeletionTimestamp.IsZero())
		}
		return nil
	}
	a.stays("the new claim is kept while only run 1's pod names it", kept)

	// Run 2's pod comes, and the claim binds for it (WaitForFirstConsumer).
	run2 := a.createPod("run-2", claimVolume("ws"))
	pv2 := a.bind(second)
	a.stays("the new claim is kept while run 2 runs", func(ctx context.Context) error {
		if err := kept(ctx); err != nil {
			return err
		}
		return a.outcomeIs(pv2, "")(ctx)
	})
	a.endPod(run2, corev1.PodFailed)
	a.eventually("run 2's outcome on its own PV", a.outcomeIs(pv2, v1alpha1.OutcomeFailed))
	a.eventually("run 2's claim released", a.gone(second))
	if err := a.outcomeIs(pv1, v1alpha1.OutcomeSucceeded)(a.ctx); err != nil {
		t.Errorf("run 1's PV: %v", err)
	}
}

// An invalid release annotation is refused with a Warning Event that says
// the fix, and the claim is left alone until it changes; fixing it
// releases the claim.
func TestEnvtestInvalidReleaseAnnotation(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	pvc := a.createClaim("ws", func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Annotations[v1alpha1.AnnotationRelease] = "always"
	})
	pod := a.createPod("build", claimVolume(pvc.Name))
	a.bind(pvc)
	a.endPod(pod, corev1.PodSucceeded)
	a.waitEvent("PersistentVolumeClaim", pvc.Name, `Warning InvalidAnnotation claim `+a.ns+`/ws: annotation layercache.dev/release has the value "always"; the only value is "on-pod-exit"`)
	if err := a.hasFinalizers(pvc, finalizerPVCProtection)(a.ctx); err != nil {
		t.Errorf("a refused claim must not be held: %v", err)
	}

	if err := a.get(a.ctx, pvc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	pvc.Annotations[v1alpha1.AnnotationRelease] = v1alpha1.ReleaseOnPodExit
	if err := a.c.Patch(a.ctx, pvc, patch); err != nil {
		t.Fatalf("fixing the annotation: %v", err)
	}
	a.eventually("the fixed claim released", a.gone(pvc))
}

func ptrTo[T any](v T) *T { return &v }

// A claim shared by two pods is kept while one runs, with the outcome so
// far on the PV, and released once both have ended: failed if one failed.
func TestEnvtestSharedClaim(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	pvc := a.createClaim("ws", releasable)
	one := a.createPod("one", claimVolume(pvc.Name))
	two := a.createPod("two", claimVolume(pvc.Name))
	pv := a.bind(pvc)

	a.endPod(one, corev1.PodSucceeded)
	a.eventually("the outcome so far", a.outcomeIs(pv, v1alpha1.OutcomeSucceeded))
	a.stays("the claim is kept while pod two runs", a.hasFinalizers(pvc, finalizerPVCProtection, v1alpha1.FinalizerOutcome))

	a.endPod(two, corev1.PodFailed)
	a.eventually("the claim released", a.gone(pvc))
	if err := a.outcomeIs(pv, v1alpha1.OutcomeFailed)(a.ctx); err != nil {
		t.Error(err)
	}
}

// The manager's finalizer never strands a claim: one deleted before any pod
// used it goes at once (the manager lifts the API server's pvc-protection
// too, after confirming with the API server that no pod names it).
func TestEnvtestUnusedClaimDeletedGoesAtOnce(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	pvc := a.createClaim("ws")
	a.eventually("the outcome finalizer on the claim", a.hasFinalizers(pvc, finalizerPVCProtection, v1alpha1.FinalizerOutcome))
	if err := a.c.Delete(a.ctx, pvc); err != nil {
		t.Fatalf("deleting the claim: %v", err)
	}
	a.eventually("the deleted claim gone", a.gone(pvc))
}

// Regression: a pipeline that releases its claim and at once creates the
// next one of the same name. The API server keeps times in whole seconds,
// so the new claim may carry the very second the earlier run's pod started;
// counted as a user of the new claim, that ended pod made the manager
// delete the new claim before the next run's pod came to use it.
//
// The test starts each run at the beginning of a second so that the new
// claim lands in run 1's start second, and tries again (a few times, under
// new names) if the machine was too slow for that.
func TestEnvtestClaimRecreatedAtOnceIsKept(t *testing.T) {
	a := newAPITest(t)
	a.startManager()
	const attempts = 5
	for i := range attempts {
		name := fmt.Sprintf("ws-%d", i)
		a.eventually("the start of a second", func(context.Context) error {
			if time.Now().Nanosecond() > int(50*time.Millisecond) {
				return fmt.Errorf("not at the start of a second")
			}
			return nil
		})
		first := a.createClaim(name, releasable)
		run1 := a.createPod("run-1-"+name, claimVolume(name))
		a.bind(first)
		a.endPod(run1, corev1.PodSucceeded)
		a.eventually("run 1's claim released", a.gone(first))
		second := a.createClaim(name, releasable)
		if err := a.get(a.ctx, run1); err != nil {
			t.Fatal(err)
		}
		if !run1.Status.StartTime.Equal(&second.CreationTimestamp) {
			t.Logf("attempt %d: run 1 started at %v, the new claim was created at %v; again", i, run1.Status.StartTime, second.CreationTimestamp)
			continue
		}

		a.eventually("the new claim held for its outcome", a.hasFinalizers(second, finalizerPVCProtection, v1alpha1.FinalizerOutcome))
		a.stays("the new claim is kept until its own pod ends", func(ctx context.Context) error {
			cur := second.DeepCopy()
			if err := a.get(ctx, cur); err != nil {
				return fmt.Errorf("new claim: %w", err)
			}
			if !cur.DeletionTimestamp.IsZero() {
				return fmt.Errorf("new claim is being deleted")
			}
			return nil
		})
		run2 := a.createPod("run-2-"+name, claimVolume(name))
		pv2 := a.bind(second)
		a.endPod(run2, corev1.PodSucceeded)
		a.eventually("run 2's outcome on its own PV", a.outcomeIs(pv2, v1alpha1.OutcomeSucceeded))
		a.eventually("run 2's claim released", a.gone(second))
		return
	}
	t.Fatalf("in %d attempts the new claim never landed in run 1's start second: the machine is too slow for this test", attempts)
}
