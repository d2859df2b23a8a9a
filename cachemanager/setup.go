package cachemanager

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/podfacts"
)

// Field indexes on the manager's cache.
const (
	// indexPodClaims indexes pods by the names of the standalone PVCs they
	// use.
	indexPodClaims = "layercache.dev/claims"
	// indexReplicaCache indexes CacheReplicas by their Cache's name.
	indexReplicaCache = "layercache.dev/replica-cache"
	// indexReplicaNode indexes CacheReplicas by their node.
	indexReplicaNode = "layercache.dev/replica-node"
	// indexOpenVolumes indexes the layercache write volumes (PVs) whose
	// build has not ended by their cache, NAMESPACE/NAME.
	indexOpenVolumes = "layercache.dev/open-volumes"
	// indexCSIWriters indexes pods whose CSI inline volumes may still
	// commit to a cache by that cache, NAMESPACE/NAME.
	indexCSIWriters = "layercache.dev/csi-writers"
)

// CacheOptions returns the informer cache settings of the manager. In a big
// cluster Pods dominate memory, so they are cut down to the few fields the
// release controller reads before they enter the cache, and no cached object
// keeps its managed fields.
func CacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Transform: slimPod},
		},
	}
}

// Setup registers the field indexes and the controllers with mgr, and
// their metrics with reg; lc bounds how long and how large Caches are
// kept in the cluster.
func Setup(ctx context.Context, mgr manager.Manager, reg prometheus.Registerer, lc Lifecycle) error {
	metrics, err := NewMetrics(reg)
	if err != nil {
		return err
	}
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &corev1.Pod{}, indexPodClaims, podClaimsIndex); err != nil {
		return fmt.Errorf("indexing pods by claim: %w", err)
	}
	if err := idx.IndexField(ctx, &v1alpha1.CacheReplica{}, indexReplicaCache, replicaCacheIndex); err != nil {
		return fmt.Errorf("indexing cache replicas by cache: %w", err)
	}
	if err := idx.IndexField(ctx, &v1alpha1.CacheReplica{}, indexReplicaNode, replicaNodeIndex); err != nil {
		return fmt.Errorf("indexing cache replicas by node: %w", err)
	}
	if err := idx.IndexField(ctx, &corev1.PersistentVolume{}, indexOpenVolumes, openVolumesIndex); err != nil {
		return fmt.Errorf("indexing volumes by cache: %w", err)
	}
	if err := idx.IndexField(ctx, &corev1.Pod{}, indexHeldPods, heldPodsIndex); err != nil {
		return fmt.Errorf("indexing held pods by node: %w", err)
	}
	if err := idx.IndexField(ctx, &corev1.Pod{}, indexCSIWriters, csiWritersIndex); err != nil {
		return fmt.Errorf("indexing pods by the caches their CSI volumes write: %w", err)
	}
	release := &ReleaseReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder(Component),
		Metrics:   metrics,
	}
	if err := release.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the release controller: %w", err)
	}
	caches := &CacheReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder(Component),
	}
	if err := caches.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the cache controller: %w", err)
	}
	expiry := &ExpiryReconciler{
		Client:        mgr.GetClient(),
		Recorder:      mgr.GetEventRecorder(Component),
		Metrics:       metrics,
		DefaultMaxAge: lc.CacheMaxAge,
	}
	if err := expiry.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the cache expiry controller: %w", err)
	}
	sizes := &NamespaceSizeReconciler{
		Client:         mgr.GetClient(),
		Recorder:       mgr.GetEventRecorder(Component),
		Metrics:        metrics,
		DefaultMaxSize: lc.NamespaceMaxCacheSize,
	}
	if err := sizes.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the namespace cache size controller: %w", err)
	}
	holds := &HoldReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(Component)}
	if err := holds.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the pod hold controller: %w", err)
	}
	return nil
}

// slimPod keeps what the release and hold controllers and the in-use
// index read of a Pod: identity, deletion, finalizers, the volumes that
// name PVCs, layercache CSI volumes (their cache, mode and read-only
// flag), phase, start time, and which containers run or exited (with
// their exit codes and finish times).
// Everything else (containers, env, images, conditions) is dropped: without
// the spec's containers podfacts waits for the pod's phase before it calls
// the pod ended, a second later than the node agent.
func slimPod(in any) (any, error) {
	pod, ok := in.(*corev1.Pod)
	if !ok {
		return in, nil
	}
	out := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         pod.Namespace,
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			CreationTimestamp: pod.CreationTimestamp,
			DeletionTimestamp: pod.DeletionTimestamp,
			OwnerReferences:   pod.OwnerReferences,
			Finalizers:        pod.Finalizers,
		},
		Spec: corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status: corev1.PodStatus{
			Phase:     pod.Status.Phase,
			StartTime: pod.Status.StartTime,
		},
	}
	for _, v := range pod.Spec.Volumes {
		if src, ok := slimVolume(v.VolumeSource); ok {
			out.Spec.Volumes = append(out.Spec.Volumes, corev1.Volume{Name: v.Name, VolumeSource: src})
		}
	}
	out.Status.InitContainerStatuses = slimContainerStatuses(pod.Status.InitContainerStatuses)
	out.Status.ContainerStatuses = slimContainerStatuses(pod.Status.ContainerStatuses)
	out.Status.EphemeralContainerStatuses = slimContainerStatuses(pod.Status.EphemeralContainerStatuses)
	return out, nil
}

// slimVolume is what slimPod keeps of a volume: the claim it names, or a
// layercache CSI volume's cache and mode.
func slimVolume(v corev1.VolumeSource) (corev1.VolumeSource, bool) {
	switch {
	case v.PersistentVolumeClaim != nil:
		return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.PersistentVolumeClaim.ClaimName}}, true
	case v.CSI != nil && v.CSI.Driver == v1alpha1.CSIDriverName:
		attrs := map[string]string{}
		for _, k := range []string{v1alpha1.CSIAttributeCache, v1alpha1.CSIAttributeMode} {
			if val, ok := v.CSI.VolumeAttributes[k]; ok {
				attrs[k] = val
			}
		}
		return corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: v.CSI.Driver, ReadOnly: v.CSI.ReadOnly, VolumeAttributes: attrs}}, true
	}
	return corev1.VolumeSource{}, false
}

// slimContainerStatuses keeps the containers that run, which hold a pod's
// end even in a terminal phase, and those that exited.
func slimContainerStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for _, s := range in {
		switch t := s.State.Terminated; {
		case t != nil:
			out = append(out, corev1.ContainerStatus{
				Name:  s.Name,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: t.ExitCode, FinishedAt: t.FinishedAt}},
			})
		case s.State.Running != nil:
			out = append(out, corev1.ContainerStatus{Name: s.Name, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})
		}
	}
	return out
}

func podClaimsIndex(obj client.Object) []string {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	return claimNames(pod)
}

func replicaCacheIndex(obj client.Object) []string {
	if r, ok := obj.(*v1alpha1.CacheReplica); ok {
		return []string{r.Spec.Cache}
	}
	return nil
}

func replicaNodeIndex(obj client.Object) []string {
	if r, ok := obj.(*v1alpha1.CacheReplica); ok {
		return []string{r.Spec.Node}
	}
	return nil
}

// openVolumesIndex keys a layercache write volume (PV) by its cache until
// the node agent records its build's end (the result annotation). A read
// volume is left out: it never commits, so it needs no cache kept for
// it, and a reader's namespace must not keep the owner's cache from
// expiry or its namespace's size bound.
func openVolumesIndex(obj client.Object) []string {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || !isOurVolume(pv) || pv.Annotations[v1alpha1.AnnotationResult] != "" ||
		pv.Annotations[v1alpha1.AnnotationMode] == string(v1alpha1.ModeRead) {
		return nil
	}
	// A released volume's claim is gone: its build has ended, and the
	// agent records what became of it as it deletes the volume.
	if pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed {
		return nil
	}
	if ref := pv.Annotations[v1alpha1.AnnotationCache]; ref != "" {
		return []string{ref}
	}
	return nil
}

// csiWritersIndex keys a pod by the caches its CSI inline volumes may
// write (podfacts.CSIWrites) until its build has ended: while it has not
// reached a terminal phase, and after that while the node agent still
// holds it (finalizer layercache.dev/build-end), which it lifts once the
// pod's volumes have ended. A pod waiting to start counts: it is about to
// mount the cache. A kept pod whose volumes have ended does not.
func csiWritersIndex(obj client.Object) []string {
	pod, ok := obj.(*corev1.Pod)
	if !ok || (podfacts.Terminal(pod) && !slices.Contains(pod.Finalizers, v1alpha1.FinalizerBuildEnd)) {
		return nil
	}
	var keys []string
	for _, name := range podfacts.CSIWrites(pod) {
		keys = append(keys, pod.Namespace+"/"+name)
	}
	return keys
}
