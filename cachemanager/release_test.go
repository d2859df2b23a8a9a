package cachemanager

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
	"github.com/layercache/layercache/podfacts"
)

const ns = "builds"

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// at returns t0 plus the given number of seconds, as API time.
func at(sec int) *metav1.Time {
	t := metav1.NewTime(t0.Add(time.Duration(sec) * time.Second))
	return &t
}

type claimOpt func(*corev1.PersistentVolumeClaim)

// claim is a bound claim of class layercache, created at t0, with the
// pvc-protection finalizer the API server adds.
func claim(name string, opts ...claimOpt) *corev1.PersistentVolumeClaim {
	class := v1alpha1.StorageClassName
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, UID: types.UID("uid-" + name),
			CreationTimestamp: *at(0),
			Annotations:       map[string]string{v1alpha1.AnnotationCache: "maven"},
			Finalizers:        []string{finalizerPVCProtection},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			VolumeName:       "pv-" + name,
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
	for _, o := range opts {
		o(pvc)
	}
	return pvc
}

func ownedBy(podName string) claimOpt {
	return func(pvc *corev1.PersistentVolumeClaim) {
		yes := true
		pvc.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: podName, UID: types.UID("uid-" + podName), Controller: &yes,
		}}
	}
}

func annotated(key, value string) claimOpt {
	return func(pvc *corev1.PersistentVolumeClaim) { pvc.Annotations[key] = value }
}

func class(name string) claimOpt {
	return func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Spec.StorageClassName = &name
		delete(pvc.Annotations, v1alpha1.AnnotationCache)
	}
}

func createdAt(sec int) claimOpt {
	return func(pvc *corev1.PersistentVolumeClaim) { pvc.CreationTimestamp = *at(sec) }
}

func unbound() claimOpt {
	return func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Spec.VolumeName = ""
		pvc.Status.Phase = corev1.ClaimPending
	}
}

func deleting() claimOpt {
	return func(pvc *corev1.PersistentVolumeClaim) { pvc.DeletionTimestamp = at(500) }
}

// volume is the PV a node agent made for the claim.
func volume(pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: pvc.Spec.VolumeName,
			Annotations: map[string]string{
				annProvisionedBy:        v1alpha1.ProvisionerName,
				v1alpha1.AnnotationNode: "node-a",
			},
		},
		Spec: corev1.PersistentVolumeSpec{
			ClaimRef: &corev1.ObjectReference{Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
		},
	}
}

// pod uses the named claims; "eph:VOL" adds a generic ephemeral volume.
func pod(name string, phase corev1.PodPhase, claims ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), CreationTimestamp: *at(1)},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status:     corev1.PodStatus{Phase: phase, StartTime: at(2)},
	}
	for _, c := range claims {
		if vol, ok := strings.CutPrefix(c, "eph:"); ok {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}})
			continue
		}
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c},
		}})
	}
	if podfacts.Terminal(p) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "build", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{FinishedAt: *at(60)},
		}}}
	}
	return p
}

// stillRunning adds a container that still runs, as in a pod made terminal
// from outside (an eviction, the pod garbage collector).
func stillRunning(p *corev1.Pod) *corev1.Pod {
	p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
		Name: "sidecar", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
	})
	return p
}

// ran sets when the pod started and, if it ended, when it finished.
func ran(p *corev1.Pod, start, finish int) *corev1.Pod {
	p.CreationTimestamp = *at(start - 1)
	p.Status.StartTime = at(start)
	for i := range p.Status.ContainerStatuses {
		p.Status.ContainerStatuses[i].State.Terminated.FinishedAt = *at(finish)
	}
	return p
}

func storageClasses() []client.Object {
	return []client.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.StorageClassName}, Provisioner: v1alpha1.ProvisionerName},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "standard"}, Provisioner: "rancher.io/local-path"},
	}
}

func newFakeClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme, err := bootstrap.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().
		WithScheme(scheme).
		WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Cache{}).
		WithIndex(&corev1.Pod{}, indexPodClaims, podClaimsIndex).
		WithIndex(&v1alpha1.CacheReplica{}, indexReplicaCache, replicaCacheIndex).
		WithIndex(&v1alpha1.CacheReplica{}, indexReplicaNode, replicaNodeIndex).
		WithIndex(&corev1.PersistentVolume{}, indexOpenVolumes, openVolumesIndex).
		WithIndex(&corev1.Pod{}, indexHeldPods, heldPodsIndex).
		WithIndex(&corev1.Pod{}, indexCSIWriters, csiWritersIndex).
		Build()
}

// drain returns the events recorded so far.
func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestRelease(t *testing.T) {
	eph := claim("job-1-abcde-cache", ownedBy("job-1-abcde"))
	standalone := claim("ws")
	onExit := claim("ws", annotated(v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit))

	tests := []struct {
		name  string
		claim *corev1.PersistentVolumeClaim
		noPV  bool
		// pvOutcome is on the PV before the reconcile.
		pvOutcome string
		pods      []*corev1.Pod
		outcome   string // on the PV afterwards; "" for none
		kept      bool   // the claim still exists afterwards
		events    []string
		wantErr   bool // a terminal error
		requeue   bool
	}{{
		// Regression (found by e2e/argo): deleting a failed Workflow
		// deletes its pods and its claim at once; the failed pod left the
		// cache first and the PV was rewritten to succeeded.
		name:      "a claim being deleted keeps the failure recorded while its pods were there",
		claim:     claim("ws", deleting()),
		pvOutcome: v1alpha1.OutcomeFailed,
		pods:      []*corev1.Pod{ran(pod("step-one", corev1.PodSucceeded, "ws"), 1, 10)},
		outcome:   v1alpha1.OutcomeFailed,
	}, {
		name:      "a claim in use records a failure turned success by a later pod",
		claim:     standalone,
		pvOutcome: v1alpha1.OutcomeFailed,
		pods:      []*corev1.Pod{ran(pod("retry", corev1.PodSucceeded, "ws"), 1, 10)},
		outcome:   v1alpha1.OutcomeSucceeded,
		kept:      true,
		events:    []string{"Normal OutcomeRecorded Recorded pod outcome succeeded"},
	}, {
		// Regression: deleting the claim of a kept Job pod made the
		// ephemeral-volume controller recreate it, over and over. The node
		// agent ends such volumes; the manager writes nothing about them.
		name:  "a pod's ephemeral claim is left to its pod when the pod succeeds",
		claim: eph,
		pods:  []*corev1.Pod{pod("job-1-abcde", corev1.PodSucceeded, "eph:cache")},
		kept:  true,
	}, {
		name:  "a pod's ephemeral claim is left to its pod when the pod fails",
		claim: eph,
		pods:  []*corev1.Pod{pod("job-1-abcde", corev1.PodFailed, "eph:cache")},
		kept:  true,
	}, {
		name:  "a pod's ephemeral claim is left to its pod even when annotated for release",
		claim: claim("job-1-abcde-cache", ownedBy("job-1-abcde"), annotated(v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit)),
		pods:  []*corev1.Pod{pod("job-1-abcde", corev1.PodSucceeded, "eph:cache")},
		kept:  true,
	}, {
		name:  "a pod's ephemeral claim whose pod is gone is left to the garbage collector",
		claim: eph,
		kept:  true,
	}, {
		name:  "shared claim kept while one of its pods runs, with the outcome so far",
		claim: onExit,
		pods: []*corev1.Pod{
			pod("one", corev1.PodSucceeded, "ws"),
			pod("two", corev1.PodRunning, "ws"),
		},
		outcome: v1alpha1.OutcomeSucceeded,
		kept:    true,
		events:  []string{"Normal OutcomeRecorded Recorded pod outcome succeeded on PersistentVolume pv-ws (pod one succeeded)"},
	}, {
		// Tekton under coschedule: pipelineruns deletes the workspace claim
		// at completion and lifts pvc-protection itself, while its affinity
		// assistant pod still runs: the PV must already say how the Tasks'
		// pods ended.
		name:  "a pod that holds the claim for the whole run does not hide the Tasks' outcome",
		claim: standalone,
		pods: []*corev1.Pod{
			ran(pod("affinity-assistant-0", corev1.PodRunning, "ws"), 1, 0),
			ran(pod("run-checkout-pod", corev1.PodSucceeded, "ws"), 3, 20),
			ran(pod("run-build-pod", corev1.PodSucceeded, "ws"), 25, 60),
		},
		outcome: v1alpha1.OutcomeSucceeded,
		kept:    true,
		events:  []string{"Normal OutcomeRecorded Recorded pod outcome succeeded on PersistentVolume pv-ws (pod run-build-pod succeeded)"},
	}, {
		// Released, the claim's volume would be committed under the
		// container that still writes to it.
		name:  "a failed pod whose container still runs holds the claim",
		claim: onExit,
		pods:  []*corev1.Pod{stillRunning(pod("evicted", corev1.PodFailed, "ws"))},
		kept:  true,
	}, {
		name:  "shared claim released after both pods end, failed if one failed",
		claim: onExit,
		pods: []*corev1.Pod{
			ran(pod("one", corev1.PodSucceeded, "ws"), 2, 50),
			ran(pod("two", corev1.PodFailed, "ws"), 10, 40),
		},
		outcome: v1alpha1.OutcomeFailed,
		events:  []string{"Normal OutcomeRecorded Recorded pod outcome failed on PersistentVolume pv-ws (pod two failed, pod one succeeded)", "Normal Released"},
	}, {
		name:    "standalone claim without the annotation gets the outcome but is kept",
		claim:   standalone,
		pods:    []*corev1.Pod{pod("build", corev1.PodSucceeded, "ws")},
		outcome: v1alpha1.OutcomeSucceeded,
		kept:    true,
		events:  []string{"Normal OutcomeRecorded"},
	}, {
		name:  "job retry: the claim is kept while the retry runs, failed so far",
		claim: standalone,
		pods: []*corev1.Pod{
			ran(pod("job-x1", corev1.PodFailed, "ws"), 2, 30),
			ran(pod("job-x2", corev1.PodRunning, "ws"), 40, 0),
		},
		outcome: v1alpha1.OutcomeFailed,
		kept:    true,
		events:  []string{"Normal OutcomeRecorded Recorded pod outcome failed on PersistentVolume pv-ws (pod job-x1 failed)"},
	}, {
		name:  "job retry: a successful retry decides the outcome",
		claim: standalone,
		pods: []*corev1.Pod{
			ran(pod("job-x1", corev1.PodFailed, "ws"), 2, 30),
			ran(pod("job-x2", corev1.PodSucceeded, "ws"), 40, 90),
		},
		outcome: v1alpha1.OutcomeSucceeded,
		kept:    true,
		events:  []string{"Normal OutcomeRecorded Recorded pod outcome succeeded on PersistentVolume pv-ws (pod job-x2 succeeded)"},
	}, {
		name:  "job retry: a failed retry after a failure records failed",
		claim: standalone,
		pods: []*corev1.Pod{
			ran(pod("job-x1", corev1.PodFailed, "ws"), 2, 30),
			ran(pod("job-x2", corev1.PodFailed, "ws"), 40, 90),
		},
		outcome: v1alpha1.OutcomeFailed,
		kept:    true,
		events:  []string{"Normal OutcomeRecorded"},
	}, {
		name:  "claim of another provisioner is ignored",
		claim: claim("data", class("standard"), ownedBy("job-2")),
		pods:  []*corev1.Pod{pod("job-2", corev1.PodSucceeded, "data")},
		kept:  true,
	}, {
		name:    "claim of another class that names a cache counts as layercache",
		claim:   claim("named", class("standard"), annotated(v1alpha1.AnnotationCache, "maven"), annotated(v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit)),
		pods:    []*corev1.Pod{pod("job-3", corev1.PodSucceeded, "named")},
		outcome: v1alpha1.OutcomeSucceeded,
		events:  []string{"Normal OutcomeRecorded", "Normal Released"},
	}, {
		name:    "invalid release annotation is refused with an event",
		claim:   claim("ws", annotated(v1alpha1.AnnotationRelease, "always")),
		pods:    []*corev1.Pod{pod("build", corev1.PodSucceeded, "ws")},
		kept:    true,
		wantErr: true,
		events:  []string{`Warning InvalidAnnotation claim builds/ws: annotation layercache.dev/release has the value "always"; the only value is "on-pod-exit"`},
	}, {
		name:    "claim deleted by the user while its pod ran is finished when the pod ends",
		claim:   claim("ws", deleting()),
		pods:    []*corev1.Pod{pod("build", corev1.PodSucceeded, "ws")},
		outcome: v1alpha1.OutcomeSucceeded,
		events:  []string{"Normal OutcomeRecorded"},
	}, {
		name:  "a pod of an earlier claim of the same name does not release a new one",
		claim: claim("ws", annotated(v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit), createdAt(300), unbound()),
		pods:  []*corev1.Pod{ran(pod("old", corev1.PodSucceeded, "ws"), 2, 60)},
		kept:  true,
	}, {
		// Regression: the API server keeps times in whole seconds, and a
		// claim created again within the second the earlier claim's pod
		// started was released at once, before its own pod came.
		name:  "a pod of an earlier claim of the same name, started within the new one's creation second, does not release it",
		claim: claim("ws", annotated(v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit), createdAt(2), unbound()),
		pods:  []*corev1.Pod{ran(pod("old", corev1.PodSucceeded, "ws"), 2, 2)},
		kept:  true,
	}, {
		name:    "a pod of an earlier claim of the same name does not decide a bound new one",
		claim:   claim("ws", annotated(v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit), createdAt(300)),
		pods:    []*corev1.Pod{ran(pod("old", corev1.PodSucceeded, "ws"), 2, 60)},
		outcome: "",
		events:  []string{"Normal Released Deleted the claim: its pods were deleted before they were seen to end; the outcome is unknown"},
	}, {
		name:   "claim being deleted is not held for a pod of an earlier claim of the same name",
		claim:  claim("ws", deleting(), createdAt(300)),
		pods:   []*corev1.Pod{ran(pod("old", corev1.PodSucceeded, "ws"), 2, 60)},
		events: nil,
	}, {
		name:  "standalone claim without the annotation and without pods is left alone",
		claim: standalone,
		kept:  true,
	}, {
		name:   "releasable claim whose pods were deleted is released without an outcome",
		claim:  onExit,
		events: []string{"Normal Released Deleted the claim: its pods were deleted before they were seen to end"},
	}, {
		name:  "claim without pods that was never bound is left alone",
		claim: claim("ws", annotated(v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit), unbound()),
		kept:  true,
	}, {
		name:    "volume not yet in the cache: wait",
		claim:   onExit,
		noPV:    true,
		pods:    []*corev1.Pod{pod("build", corev1.PodSucceeded, "ws")},
		kept:    true,
		requeue: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			objs := storageClasses()
			pvc := tc.claim.DeepCopy()
			objs = append(objs, pvc)
			if !tc.noPV && pvc.Spec.VolumeName != "" {
				pv := volume(pvc)
				if tc.pvOutcome != "" {
					metav1.SetMetaDataAnnotation(&pv.ObjectMeta, v1alpha1.AnnotationPodOutcome, tc.pvOutcome)
				}
				objs = append(objs, pv)
			}
			for _, p := range tc.pods {
				objs = append(objs, p.DeepCopy())
			}
			c := newFakeClient(t, objs...)
			rec := events.NewFakeRecorder(100)
			r := &ReleaseReconciler{Client: c, APIReader: c, Recorder: rec, Metrics: testMetrics(t)}

			// Level-based: reconciling again must converge and then change
			// nothing. Releasing takes two passes (delete, then lift
			// pvc-protection once the deletion is seen).
			key := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pvc)}
			for range 3 {
				res, err := r.Reconcile(ctx, key)
				if tc.wantErr {
					// A terminal error is not retried; a change of the
					// claim brings it back.
					if err == nil || !errors.Is(err, reconcile.TerminalError(nil)) {
						t.Fatalf("Reconcile() error = %v, want a terminal error", err)
					}
					break
				}
				if err != nil {
					t.Fatalf("Reconcile() error = %v", err)
				}
				if got := res.RequeueAfter > 0; got != tc.requeue {
					t.Fatalf("Reconcile() = %+v, want requeue %v", res, tc.requeue)
				}
			}

			var got corev1.PersistentVolumeClaim
			err := c.Get(ctx, client.ObjectKeyFromObject(pvc), &got)
			switch {
			case tc.kept && err != nil:
				t.Errorf("claim: %v, want it kept", err)
			case tc.kept && !got.DeletionTimestamp.IsZero():
				t.Errorf("claim is being deleted, want it kept")
			case !tc.kept && !apierrors.IsNotFound(err):
				t.Errorf("claim: err = %v, finalizers %v, want it gone", err, got.Finalizers)
			}

			if pvc.Spec.VolumeName != "" && !tc.noPV {
				var pv corev1.PersistentVolume
				if err := c.Get(ctx, types.NamespacedName{Name: pvc.Spec.VolumeName}, &pv); err != nil {
					t.Fatal(err)
				}
				if got := pv.Annotations[v1alpha1.AnnotationPodOutcome]; got != tc.outcome {
					t.Errorf("outcome on PV = %q, want %q", got, tc.outcome)
				}
			}

			gotEvents := drain(rec)
			if len(gotEvents) != len(tc.events) {
				t.Fatalf("events = %q, want %d events starting with %q", gotEvents, len(tc.events), tc.events)
			}
			for i, want := range tc.events {
				if !strings.HasPrefix(gotEvents[i], want) {
					t.Errorf("event %d = %q, want it to start with %q", i, gotEvents[i], want)
				}
			}
		})
	}
}

// The informer cache can lag behind the API server: a pod the API server
// has may be missing from the cache. The claim must not be released then.
func TestReleaseWaitsForLaggingCache(t *testing.T) {
	ctx := context.Background()
	pvc := claim("ws", annotated(v1alpha1.AnnotationRelease, v1alpha1.ReleaseOnPodExit))
	cached := newFakeClient(t, append(storageClasses(), pvc.DeepCopy(), volume(pvc))...)
	apiServer := newFakeClient(t, pod("build", corev1.PodRunning, "ws"))
	r := &ReleaseReconciler{Client: cached, APIReader: apiServer, Recorder: events.NewFakeRecorder(10), Metrics: testMetrics(t)}

	res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pvc)})
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter == 0 {
		t.Errorf("Reconcile() = %+v, want a requeue", res)
	}
	if err := cached.Get(ctx, client.ObjectKeyFromObject(pvc), &corev1.PersistentVolumeClaim{}); err != nil {
		t.Errorf("claim: %v, want it kept", err)
	}
}

func TestSlimPodKeepsWhatReleaseReads(t *testing.T) {
	full := ran(pod("build", corev1.PodFailed, "ws", "eph:scratch"), 5, 70)
	full.Spec.Volumes = append(full.Spec.Volumes, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	full.Spec.Containers = []corev1.Container{{Name: "build", Image: "localhost/busybox:e2e", Env: []corev1.EnvVar{{Name: "X", Value: "y"}}}}
	full.Labels = map[string]string{"app": "build"}
	full.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	full.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady}}
	full.Status.ContainerStatuses = append(full.Status.ContainerStatuses, corev1.ContainerStatus{Name: "sidecar", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})

	out, err := slimPod(full)
	if err != nil {
		t.Fatal(err)
	}
	slim := out.(*corev1.Pod)
	if got, want := claimNames(slim), claimNames(full); !equalStrings(got, want) {
		t.Errorf("claimNames = %q, want %q", got, want)
	}
	if len(slim.Spec.Volumes) != 1 || len(slim.Spec.Containers) != 0 || slim.Labels != nil || slim.ManagedFields != nil || slim.Status.Conditions != nil {
		t.Errorf("slim pod keeps more than it needs: %+v", slim)
	}
	if podfacts.Ended(slim) != podfacts.Ended(full) || podfacts.FinalPhase(slim) != podfacts.FinalPhase(full) || !slim.Status.StartTime.Equal(full.Status.StartTime) || slim.UID != full.UID {
		t.Errorf("slim pod lost phase, start time or UID: %+v", slim)
	}
	gotFin, _ := finishedAt(slim)
	wantFin, _ := finishedAt(full)
	if !gotFin.Equal(wantFin) {
		t.Errorf("finishedAt = %v, want %v", gotFin, wantFin)
	}
	if other, _ := slimPod(&corev1.Node{}); other == nil {
		t.Errorf("slimPod dropped a non-pod object")
	}
}

func TestSlimPodKeepsWhatTheInUseIndexReads(t *testing.T) {
	for _, full := range []*corev1.Pod{
		csiBuild("writer", corev1.PodRunning, map[string]string{"cache": "maven", "size": "1Gi", "fallback": "base"}),
		csiBuild("reader", corev1.PodRunning, map[string]string{"cache": "maven", "mode": "read"}),
		readOnly(csiBuild("read-only", corev1.PodRunning, map[string]string{"cache": "maven"})),
		csiBuild("held", corev1.PodFailed, map[string]string{"cache": "maven"}, v1alpha1.FinalizerBuildEnd),
	} {
		out, err := slimPod(full)
		if err != nil {
			t.Fatal(err)
		}
		slim := out.(*corev1.Pod)
		if got, want := csiWritersIndex(slim), csiWritersIndex(full); !equalStrings(got, want) {
			t.Errorf("pod %s: csiWritersIndex(slim) = %q, want %q", full.Name, got, want)
		}
		if attrs := slim.Spec.Volumes[0].CSI.VolumeAttributes; len(attrs) > 2 {
			t.Errorf("pod %s: slim pod keeps CSI attributes %q, want only cache and mode", full.Name, attrs)
		}
	}
}

func TestPodEndedOrGone(t *testing.T) {
	running := stillRunning(pod("build", corev1.PodFailed, "ws"))
	ended := pod("build", corev1.PodFailed, "ws")
	ephemeral := pod("build", corev1.PodFailed, "eph:cache")
	tests := []struct {
		name string
		pass bool
		got  bool
	}{
		{"create: ended", true, podEndedOrGone.Create(event.CreateEvent{Object: ended})},
		{"create: terminal, a container still runs", false, podEndedOrGone.Create(event.CreateEvent{Object: running})},
		{"create: ended, only an ephemeral claim", false, podEndedOrGone.Create(event.CreateEvent{Object: ephemeral})},
		{"update: the last container stopped", true, podEndedOrGone.Update(event.UpdateEvent{ObjectOld: running, ObjectNew: ended})},
		{"update: ended already", false, podEndedOrGone.Update(event.UpdateEvent{ObjectOld: ended, ObjectNew: ended})},
		{"delete: a container still ran", true, podEndedOrGone.Delete(event.DeleteEvent{Object: running})},
	}
	for _, tt := range tests {
		if tt.got != tt.pass {
			t.Errorf("%s: passed %v, want %v", tt.name, tt.got, tt.pass)
		}
	}
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00")
}

// Regression (Tekton, coschedule: pipelineruns): at a PipelineRun's
// completion Tekton deleted the workspace claim and lifted
// pvc-protection itself while its affinity assistant pod still held the
// claim, so the volume ended before the Tasks' outcome was on the PV and a
// successful run's cache was discarded. The manager's own finalizer holds
// the claim until every pod has ended and the outcome is recorded.
func TestOutcomeFinalizerHoldsAPurgedClaim(t *testing.T) {
	ctx := context.Background()
	pvc := claim("ws")
	pvc.Finalizers = nil
	assistant := ran(pod("affinity-assistant-0", corev1.PodRunning, "ws"), 1, 0)
	objs := append(storageClasses(), pvc, volume(pvc), assistant,
		ran(pod("run-build-pod", corev1.PodSucceeded, "ws"), 25, 60))
	c := newFakeClient(t, objs...)
	r := &ReleaseReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100), Metrics: testMetrics(t)}
	key := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pvc)}

	if _, err := r.Reconcile(ctx, key); err != nil {
		t.Fatal(err)
	}
	var got corev1.PersistentVolumeClaim
	if err := c.Get(ctx, key.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got.Finalizers, v1alpha1.FinalizerOutcome) {
		t.Fatalf("claim finalizers %v, want %s", got.Finalizers, v1alpha1.FinalizerOutcome)
	}

	// Tekton deletes the claim at completion; pvc-protection is gone.
	if err := c.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key.NamespacedName, &got); err != nil {
		t.Fatalf("the claim went while the assistant still held it: %v", err)
	}

	// The assistant is stopped and ends; only now may the claim go.
	assistant.Status.Phase = corev1.PodSucceeded
	assistant.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "nop", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{FinishedAt: *at(70)},
	}}}
	if err := c.Status().Update(ctx, assistant); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key.NamespacedName, &got); !apierrors.IsNotFound(err) {
		t.Errorf("claim after every pod ended: %v, finalizers %v; want it gone", err, got.Finalizers)
	}
	var pv corev1.PersistentVolume
	if err := c.Get(ctx, types.NamespacedName{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		t.Fatal(err)
	}
	if o := pv.Annotations[v1alpha1.AnnotationPodOutcome]; o != v1alpha1.OutcomeSucceeded {
		t.Errorf("PV outcome %q, want succeeded", o)
	}
}

func testMetrics(t testing.TB) *Metrics {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestKeepsFailure(t *testing.T) {
	failedAt := *at(100)
	recorded := func(outcome string, attempt *metav1.Time) *corev1.PersistentVolume {
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationPodOutcome: outcome}}}
		if attempt != nil {
			pv.Annotations[annOutcomeAttempt] = attempt.UTC().Format(time.RFC3339Nano)
		}
		return pv
	}
	live, deleting := &corev1.PersistentVolumeClaim{}, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: at(200)}}
	tests := []struct {
		name    string
		pvc     *corev1.PersistentVolumeClaim
		pv      *corev1.PersistentVolume
		outcome string
		attempt metav1.Time
		keep    bool
	}{
		{"the failed attempt's pods went away: an older success is left", live, recorded(v1alpha1.OutcomeFailed, &failedAt), v1alpha1.OutcomeSucceeded, *at(50), true},
		{"the same attempt", live, recorded(v1alpha1.OutcomeFailed, &failedAt), v1alpha1.OutcomeSucceeded, failedAt, true},
		{"a newer attempt succeeded (a Job's retry)", live, recorded(v1alpha1.OutcomeFailed, &failedAt), v1alpha1.OutcomeSucceeded, *at(150), false},
		{"a claim being deleted gets no newer attempt", deleting, recorded(v1alpha1.OutcomeFailed, &failedAt), v1alpha1.OutcomeSucceeded, *at(150), true},
		{"a failure recorded by an earlier version, claim live", live, recorded(v1alpha1.OutcomeFailed, nil), v1alpha1.OutcomeSucceeded, *at(50), false},
		{"a failure recorded by an earlier version, claim being deleted", deleting, recorded(v1alpha1.OutcomeFailed, nil), v1alpha1.OutcomeSucceeded, *at(50), true},
		{"a recorded success turns failed", live, recorded(v1alpha1.OutcomeSucceeded, &failedAt), v1alpha1.OutcomeFailed, *at(50), false},
	}
	for _, tt := range tests {
		if got := keepsFailure(tt.pvc, tt.pv, tt.outcome, tt.attempt.Time); got != tt.keep {
			t.Errorf("%s: keepsFailure = %v, want %v", tt.name, got, tt.keep)
		}
	}
}
