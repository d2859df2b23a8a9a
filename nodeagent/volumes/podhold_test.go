package volumes

import (
	"context"
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

// holdEnv is podHolds over a fake store and a fake API server that both
// the informer's store and the API server's objects come from.
type holdEnv struct {
	holds *podHolds
	store *kittest.FakeStore
	kube  *fake.Clientset
	pods  cache.Indexer
	pvs   cache.Indexer
}

func newHoldEnv(t *testing.T) *holdEnv {
	t.Helper()
	st := kittest.NewFakeStore()
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	claims := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	pvs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	// The claim build-7x2k-cache, owned by pod build-7x2k, bound to this
	// node's PV pvc-1; and a claim bound to another provisioner's PV.
	must(t, claims.Add(&corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: buildPod + "-cache", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: buildPod, UID: "uid-" + buildPod, Controller: new(true)}}},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pvc-1"},
	}))
	must(t, claims.Add(&corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "other-cache", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: "other", UID: "uid-other", Controller: new(true)}}},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pvc-elsewhere"},
	}))
	// Standalone claims: ws is released on pod exit (the manager records
	// its pods' outcome on PV pvc-ws), shared is not.
	for _, c := range []struct{ name, release string }{{"ws", v1alpha1.ReleaseOnPodExit}, {"shared", ""}} {
		must(t, claims.Add(&corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: c.name, Annotations: map[string]string{v1alpha1.AnnotationRelease: c.release}},
			Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: "pvc-" + c.name},
		}))
		must(t, pvs.Add(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-" + c.name}}))
	}
	must(t, pvs.Add(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}}))
	e := &holdEnv{store: st, kube: fake.NewClientset(), pods: pods, pvs: pvs}
	e.holds = newPodHolds(st, e.kube, pods, corelisters.NewPersistentVolumeClaimLister(claims), corelisters.NewPersistentVolumeLister(pvs))
	t.Cleanup(e.holds.queue.ShutDown)
	return e
}

// setPod is the pod as the API server and the informer both have it.
func (e *holdEnv) setPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
		_, err = e.kube.CoreV1().Pods(pod.Namespace).Update(ctx, pod, metav1.UpdateOptions{})
		must(t, err)
	} else {
		_, err = e.kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		must(t, err)
	}
	must(t, e.pods.Update(pod))
}

// sync runs one hold pass over the pod and returns its finalizers as the
// API server then has them (and updates the informer's copy).
func (e *holdEnv) sync(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	ctx := context.Background()
	must(t, e.holds.sync(ctx, pod.Namespace+"/"+pod.Name))
	got, err := e.kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	must(t, err)
	must(t, e.pods.Update(got))
	return got.Finalizers
}

func TestPodHolds(t *testing.T) {
	claimPod := func(phase corev1.PodPhase) *corev1.Pod {
		return kittest.EphemeralPod(buildPod, phase, phase == corev1.PodRunning)
	}
	csiPod := func(phase corev1.PodPhase) *corev1.Pod {
		pod := csiPodObject("csi-build", phase)
		if phase == corev1.PodRunning {
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "build", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		}
		return pod
	}
	claimUser := func(claim string, phase corev1.PodPhase) *corev1.Pod {
		pod := kittest.EphemeralPod("user-"+claim, phase, phase == corev1.PodRunning)
		pod.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}
		return pod
	}
	mountClaim := func(st *kittest.FakeStore) { mountFake(t, st, "pvc-1", nil) }
	mountCSI := func(st *kittest.FakeStore) {
		mountFake(t, st, "csi-1", map[string]string{labelPodUID: "uid-csi-build"})
	}
	mount := func(id string) func(*kittest.FakeStore) {
		return func(st *kittest.FakeStore) { mountFake(t, st, id, nil) }
	}
	// The manager records the outcome of a standalone claim's pods on its
	// PV before it releases the claim.
	decide := func(e *holdEnv) {
		must(t, e.pvs.Update(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-ws",
			Annotations: map[string]string{v1alpha1.AnnotationPodOutcome: v1alpha1.OutcomeSucceeded}}}))
	}
	tests := []struct {
		name    string
		mount   func(*kittest.FakeStore)
		running *corev1.Pod // the pod while it runs
		ended   *corev1.Pod // the pod once it ended
		// endVolume is the store volume the build's end removes; or
		// release, what else lets the pod go.
		endVolume string
		release   func(*holdEnv)
		wantHeld  bool // while it runs
	}{
		{name: "a claim the pod owns", mount: mountClaim, running: claimPod(corev1.PodRunning), ended: claimPod(corev1.PodSucceeded),
			endVolume: "pvc-1", wantHeld: true},
		{name: "a CSI inline volume", mount: mountCSI, running: csiPod(corev1.PodRunning), ended: csiPod(corev1.PodFailed),
			endVolume: "csi-1", wantHeld: true},
		{name: "a standalone claim released on pod exit", mount: mount("pvc-ws"), running: claimUser("ws", corev1.PodRunning),
			ended: claimUser("ws", corev1.PodSucceeded), release: decide, wantHeld: true},
		{name: "a standalone claim the manager does not release", mount: mount("pvc-shared"), running: claimUser("shared", corev1.PodRunning)},
		{name: "a claim of another provisioner", running: kittest.EphemeralPod("other", corev1.PodRunning, true)},
		{name: "a claim whose volume is not mounted yet", running: claimPod(corev1.PodRunning)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newHoldEnv(t)
			if tt.mount != nil {
				tt.mount(e.store)
			}
			pod := tt.running.DeepCopy()
			pod.Finalizers = []string{"example.com/keep"}
			e.setPod(t, pod)
			got := e.sync(t, pod)
			if held := slices.Contains(got, v1alpha1.FinalizerBuildEnd); held != tt.wantHeld {
				t.Fatalf("running pod: finalizers %q, want held %v", got, tt.wantHeld)
			}
			if !tt.wantHeld {
				for _, a := range e.kube.Actions() {
					if a.GetVerb() == "patch" {
						t.Errorf("a pod that needs no hold was patched: %v", a)
					}
				}
				return
			}
			// Ended and deleted, before the agent ended the volume: held.
			ended := tt.ended.DeepCopy()
			ended.Finalizers = got
			now := metav1.Now()
			ended.DeletionTimestamp = &now
			e.setPod(t, ended)
			if got := e.sync(t, ended); !slices.Contains(got, v1alpha1.FinalizerBuildEnd) {
				t.Fatalf("pod ended, its volume open: finalizers %q, want it still held", got)
			}
			if tt.release != nil {
				tt.release(e)
			} else {
				must(t, e.store.Discard(context.Background(), tt.endVolume))
			}
			got = e.sync(t, ended)
			if !slices.Equal(got, []string{"example.com/keep"}) {
				t.Fatalf("pod ended, its volume ended: finalizers %q, want only the other finalizer", got)
			}
		})
	}
}

// A pod deleted before it ran keeps no finalizer it would never lose.
func TestPodHoldsSkipsADeletedPod(t *testing.T) {
	e := newHoldEnv(t)
	mountFake(t, e.store, "pvc-1", nil)
	pod := kittest.EphemeralPod(buildPod, corev1.PodRunning, true)
	now := metav1.Now()
	pod.DeletionTimestamp = &now
	e.setPod(t, pod)
	if got := e.sync(t, pod); len(got) != 0 {
		t.Fatalf("finalizers %q on a pod being deleted, want none added", got)
	}
}

func mountFake(t *testing.T, st *kittest.FakeStore, id string, labels map[string]string) {
	t.Helper()
	_, err := st.Mount(context.Background(), id, layerfs.MountOptions{Cache: layerfs.CacheRef{Namespace: "ci", Name: "maven"}, Labels: labels})
	must(t, err)
}

// Provisioning a claim holds the pod that owns it before the volume is
// handed out, and fails (the library retries) while the hold cannot be
// placed: no build runs unheld, even through an API server outage.
func TestProvisionHoldsTheOwningPod(t *testing.T) {
	for _, apiDown := range []bool{false, true} {
		t.Run(map[bool]string{false: "API server up", true: "API server down"}[apiDown], func(t *testing.T) {
			st := kittest.NewFakeStore()
			env := newTestEnv(t, st)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: buildPod, UID: "uid-" + buildPod}}
			kube := fake.NewClientset(pod)
			if apiDown {
				kube.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("connection refused")
				})
			}
			env.prov.holds = newPodHolds(st, kube, cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}), nil, nil)
			opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
			opts.PVC.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: buildPod, UID: "uid-" + buildPod, Controller: new(true)}}
			_, _, err := env.prov.Provision(context.Background(), opts)
			got, getErr := kube.CoreV1().Pods("ci").Get(context.Background(), buildPod, metav1.GetOptions{})
			must(t, getErr)
			if apiDown {
				if err == nil || st.Mounts != 0 {
					t.Fatalf("Provision with the API server down: %v, %d mounts; want an error and no volume", err, st.Mounts)
				}
				return
			}
			if err != nil || !slices.Equal(got.Finalizers, []string{v1alpha1.FinalizerBuildEnd}) {
				t.Fatalf("Provision: %v; pod finalizers %q, want the hold", err, got.Finalizers)
			}
		})
	}
}
