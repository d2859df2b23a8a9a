package cachemanager

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/podfacts"
)

const (
	finalizerPVCProtection = "kubernetes.io/pvc-protection"

	// Set on a PVC by the PV controller while, and after, the named
	// provisioner provisions it.
	annStorageProvisioner     = "volume.kubernetes.io/storage-provisioner"
	annBetaStorageProvisioner = "volume.beta.kubernetes.io/storage-provisioner"
	// Set on a PV by sig-storage-lib-external-provisioner.
	annProvisionedBy = "pv.kubernetes.io/provisioned-by"

	// cacheLagWait is how long to wait when the informer cache has not yet
	// seen an object that the claim or the API server already names.
	cacheLagWait = 2 * time.Second
)

// ReleaseReconciler ends the life of a standalone layercache PVC (one that
// no pod owns) once every pod that used it has ended. The request names the
// PVC; the pods that use it bring it here when they end.
//
// As its pods end it records their outcome so far on the bound PV (failed
// if any pod of the last attempt failed); once all have ended, if the
// claim is annotated layercache.dev/release: on-pod-exit, it deletes it, and
// once it is being deleted lifts the kubernetes.io/pvc-protection
// finalizer: the pvc-protection controller would keep that as long as a
// completed pod object exists, and Job pods stay for a long time. A claim
// without the annotation is never deleted here, so a Job retry that reuses
// it finds it.
//
// Claims owned by a pod (generic ephemeral volumes) are none of its
// business: the node agent ends their volumes when their pod ends, and the
// claims go away with their pods. Deleting one would fight the
// ephemeral-volume controller, which recreates the claim of a pod that
// still exists: a loop that floods the API server while a completed pod is
// kept.
type ReleaseReconciler struct {
	// Client reads from the informer cache and writes to the API server.
	Client client.Client
	// APIReader reads from the API server. It confirms that the pods of a
	// claim are really gone before the claim is released without an outcome.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Metrics   *Metrics
}

// SetupWithManager wires the controller: a PVC is reconciled when it changes
// in a way that matters, and when a pod that uses it ends or goes away.
func (r *ReleaseReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("release").
		For(&corev1.PersistentVolumeClaim{}, builder.WithPredicates(claimChanged)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(claimsOfPod), builder.WithPredicates(podEndedOrGone)).
		Complete(r)
}

// Reconcile records the outcome and releases the claim when its pods have ended.
func (r *ReleaseReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)

	var pvc corev1.PersistentVolumeClaim
	if err := r.Client.Get(ctx, req.NamespacedName, &pvc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	ours, err := r.isLayercache(ctx, &pvc)
	if err != nil || !ours {
		return reconcile.Result{}, err
	}
	if _, owned := podfacts.OwningPod(&pvc); owned {
		return reconcile.Result{}, nil
	}
	releasable, err := isReleasable(&pvc)
	if err != nil {
		r.Recorder.Eventf(&pvc, nil, corev1.EventTypeWarning, "InvalidAnnotation", "Release", "%s", err)
		return reconcile.Result{}, reconcile.TerminalError(err)
	}

	if pvc.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(&pvc, v1alpha1.FinalizerOutcome) {
		if err := r.holdForOutcome(ctx, &pvc); err != nil {
			return reconcile.Result{}, err
		}
	}

	users, err := r.claimUsers(ctx, &pvc)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(users.ended) == 0 {
		if len(users.running) > 0 {
			return reconcile.Result{}, nil
		}
		return r.releaseUnused(ctx, &pvc, releasable)
	}

	// The outcome so far is recorded as each pod ends, not only once all
	// have: an owner may delete the claim, lifting pvc-protection itself,
	// while a pod that is no build still holds it (Tekton's affinity
	// assistant under coschedule: pipelineruns), and the volume then ends
	// with whatever the PV says.
	outcome, deciding := outcomeOf(users.ended)
	if res, err := r.recordOutcome(ctx, &pvc, outcome, deciding); err != nil || !res.IsZero() {
		return res, err
	}
	if len(users.running) > 0 {
		logger.V(1).Info("claim still in use", "pods", podNames(users.running), "outcomeSoFar", outcome)
		return reconcile.Result{}, nil
	}
	if pvc.DeletionTimestamp.IsZero() {
		if !releasable {
			logger.V(1).Info("pods ended; claim is not releasable, keeping it", "outcome", outcome)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, r.release(ctx, &pvc, deciding[0], outcome,
			fmt.Sprintf("every pod that used it has ended (outcome %s: %s)", outcome, podNames(deciding)))
	}
	return reconcile.Result{}, r.liftProtection(ctx, &pvc)
}

// isLayercache reports whether the claim is provisioned by layercache: it
// names a cache, or its StorageClass's provisioner is layercache's.
func (r *ReleaseReconciler) isLayercache(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	if _, ok := pvc.Annotations[v1alpha1.AnnotationCache]; ok {
		return true, nil
	}
	if pvc.Annotations[annStorageProvisioner] == v1alpha1.ProvisionerName ||
		pvc.Annotations[annBetaStorageProvisioner] == v1alpha1.ProvisionerName {
		return true, nil
	}
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName == "" {
		return false, nil
	}
	var sc storagev1.StorageClass
	if err := r.Client.Get(ctx, types.NamespacedName{Name: *pvc.Spec.StorageClassName}, &sc); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading StorageClass %s of claim %s/%s: %w", *pvc.Spec.StorageClassName, pvc.Namespace, pvc.Name, err)
	}
	return sc.Provisioner == v1alpha1.ProvisionerName, nil
}

func isReleasable(pvc *corev1.PersistentVolumeClaim) (bool, error) {
	v, ok := pvc.Annotations[v1alpha1.AnnotationRelease]
	if ok && v != v1alpha1.ReleaseOnPodExit {
		return false, fmt.Errorf("claim %s/%s: annotation %s has the value %q; the only value is %q (release the claim when its pods have ended), or remove the annotation to keep the claim until you delete it",
			pvc.Namespace, pvc.Name, v1alpha1.AnnotationRelease, v, v1alpha1.ReleaseOnPodExit)
	}
	return ok, nil
}

type claimUsers struct {
	running []*corev1.Pod // not yet ended: the claim is in use or about to be
	ended   []*corev1.Pod // ended after using this claim
}

// claimUsers finds the pods in the informer cache that use this
// incarnation of the claim.
func (r *ReleaseReconciler) claimUsers(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (claimUsers, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(pvc.Namespace), client.MatchingFields{indexPodClaims: pvc.Name}); err != nil {
		return claimUsers{}, fmt.Errorf("listing the pods of claim %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return classify(pods.Items, pvc), nil
}

// classify sorts the pods that use this incarnation of the claim into
// running and ended ones. A terminal phase alone does not end a pod while
// one of its containers still runs: released, the claim's volume would be
// committed under it. A pod names a claim only by name, and a released
// claim may be created again under the same name (a pipeline that makes one
// per run): an ended pod used an earlier one if this one was never bound
// (no pod mounts an unbound claim), or if it started before this one
// existed. Binding (WaitForFirstConsumer) waits for a scheduled pod, which
// starts after the claim was created, so start time against creation time
// tells them apart once the claim is bound. The API server keeps both in
// whole seconds, so the time alone would count the ended pod of a claim
// created again within the second that pod started, and release the new
// claim before its own pod came.
func classify(pods []corev1.Pod, pvc *corev1.PersistentVolumeClaim) claimUsers {
	var u claimUsers
	for i := range pods {
		pod := &pods[i]
		if !usesClaim(pod, pvc) {
			continue
		}
		switch {
		case !podfacts.Ended(pod):
			u.running = append(u.running, pod)
		case pvc.Spec.VolumeName == "":
		case pod.Status.StartTime != nil && !pod.Status.StartTime.Before(&pvc.CreationTimestamp):
			u.ended = append(u.ended, pod)
		}
	}
	return u
}

// releaseUnused handles a claim that no pod in the cache uses. Usually that
// is a claim whose pod has not come yet (nothing to do). Two cases need the
// manager:
//   - a bound, releasable standalone claim was used (binding waits for a
//     scheduled pod) by pods that were deleted before they were seen to end:
//     it is released without an outcome;
//   - a standalone claim being deleted may still be held by pvc-protection
//     for an ended pod of an earlier claim of the same name: it is lifted.
//
// Both wait until the API server confirms that no pod uses the claim.
func (r *ReleaseReconciler) releaseUnused(ctx context.Context, pvc *corev1.PersistentVolumeClaim, releasable bool) (reconcile.Result, error) {
	deleting := !pvc.DeletionTimestamp.IsZero()
	if !deleting && (!releasable || pvc.Spec.VolumeName == "") {
		return reconcile.Result{}, nil
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(pvc.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing the pods of namespace %s to confirm that claim %s is unused: %w", pvc.Namespace, pvc.Name, err)
	}
	if u := classify(pods.Items, pvc); len(u.running)+len(u.ended) > 0 {
		log.FromContext(ctx).V(1).Info("informer cache lags behind the pods of the claim")
		return reconcile.Result{RequeueAfter: cacheLagWait}, nil
	}
	if deleting {
		return reconcile.Result{}, r.liftProtection(ctx, pvc)
	}
	return reconcile.Result{}, r.release(ctx, pvc, nil, outcomeUnknown,
		"its pods were deleted before they were seen to end; the outcome is unknown, so the volume is committed only under commit policy "+string(v1alpha1.CommitAlways))
}

func isOurVolume(pv *corev1.PersistentVolume) bool {
	if pv.Annotations[annProvisionedBy] == v1alpha1.ProvisionerName {
		return true
	}
	_, ok := pv.Annotations[v1alpha1.AnnotationNode]
	return ok
}

// release deletes the claim. Lifting pvc-protection waits for the next
// reconcile, which the deletion brings, so that it patches what the API
// server has.
func (r *ReleaseReconciler) release(ctx context.Context, pvc *corev1.PersistentVolumeClaim, related *corev1.Pod, outcome, why string) error {
	// The UID precondition keeps a stale cache from deleting a claim that
	// was created again under the same name.
	if err := r.Client.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID}); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return fmt.Errorf("releasing claim %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	r.Metrics.releasedClaims.WithLabelValues(outcome).Inc()
	log.FromContext(ctx).Info("released claim", "outcome", outcome, "why", why)
	var relatedObj runtime.Object // a nil *Pod would be a non-nil interface
	if related != nil {
		relatedObj = related
	}
	r.Recorder.Eventf(pvc, relatedObj, corev1.EventTypeNormal, "Released", "Delete", "Deleted the claim: %s", why)
	return nil
}

// holdForOutcome adds FinalizerOutcome to a claim, so that its deletion
// waits until the outcome of its pods is on its PV.
func (r *ReleaseReconciler) holdForOutcome(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.AddFinalizer(pvc, v1alpha1.FinalizerOutcome)
	if err := r.Client.Patch(ctx, pvc, patch); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("adding finalizer %s to claim %s/%s: %w", v1alpha1.FinalizerOutcome, pvc.Namespace, pvc.Name, err))
	}
	return nil
}

// liftProtection removes kubernetes.io/pvc-protection and FinalizerOutcome
// from a claim being deleted whose pods have all ended.
func (r *ReleaseReconciler) liftProtection(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	ours := []string{finalizerPVCProtection, v1alpha1.FinalizerOutcome}
	if !slices.ContainsFunc(ours, func(f string) bool { return controllerutil.ContainsFinalizer(pvc, f) }) {
		return nil
	}
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	for _, f := range ours {
		controllerutil.RemoveFinalizer(pvc, f)
	}
	if err := r.Client.Patch(ctx, pvc, patch); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("removing finalizers %v from claim %s/%s: %w", ours, pvc.Namespace, pvc.Name, err))
	}
	log.FromContext(ctx).Info("lifted the claim's finalizers: every pod that used it has ended")
	return nil
}

// claimNames lists the claims a pod names by PersistentVolumeClaim volume
// source: the standalone claims it may use. (Its generic ephemeral volumes'
// claims are owned by it, which the node agent handles.)
func claimNames(pod *corev1.Pod) []string {
	var names []string
	for _, c := range podfacts.Claims(pod) {
		if !c.Owned {
			names = append(names, c.Name)
		}
	}
	return names
}

// usesClaim reports whether the pod names this claim.
func usesClaim(pod *corev1.Pod, pvc *corev1.PersistentVolumeClaim) bool {
	return slices.Contains(claimNames(pod), pvc.Name)
}

func podNames(pods []*corev1.Pod) string {
	names := make([]string, 0, len(pods))
	for _, p := range pods {
		names = append(names, fmt.Sprintf("pod %s %s", p.Name, strings.ToLower(string(p.Status.Phase))))
	}
	return strings.Join(names, ", ")
}

func claimsOfPod(_ context.Context, obj client.Object) []reconcile.Request {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	var reqs []reconcile.Request
	for _, name := range claimNames(pod) {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: name}})
	}
	return reqs
}

// podEndedOrGone passes the pod events that can release a claim: a pod that
// uses claims ended, or went away (a claim it shared may now be free). Pods
// that have already ended when the manager starts come as create events.
var podEndedOrGone = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool {
		pod, ok := e.Object.(*corev1.Pod)
		return ok && podfacts.Ended(pod) && len(claimNames(pod)) > 0
	},
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok1 := e.ObjectOld.(*corev1.Pod)
		pod, ok2 := e.ObjectNew.(*corev1.Pod)
		return ok1 && ok2 && !podfacts.Ended(old) && podfacts.Ended(pod) && len(claimNames(pod)) > 0
	},
	DeleteFunc: func(e event.DeleteEvent) bool {
		pod, ok := e.Object.(*corev1.Pod)
		return ok && len(claimNames(pod)) > 0
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// claimChanged passes claim events that can change the decision: a new
// claim (including every claim when the manager starts), a changed
// annotation, binding, and the start of deletion.
var claimChanged = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool { return isCandidate(e.Object) },
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok1 := e.ObjectOld.(*corev1.PersistentVolumeClaim)
		pvc, ok2 := e.ObjectNew.(*corev1.PersistentVolumeClaim)
		if !ok1 || !ok2 || !isCandidate(pvc) {
			return false
		}
		return old.Spec.VolumeName != pvc.Spec.VolumeName ||
			old.DeletionTimestamp.IsZero() != pvc.DeletionTimestamp.IsZero() ||
			!maps.Equal(old.Annotations, pvc.Annotations)
	},
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// isCandidate is a cheap filter before Reconcile looks at the StorageClass.
func isCandidate(obj client.Object) bool {
	pvc, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return false
	}
	_, named := pvc.Annotations[v1alpha1.AnnotationCache]
	return named || (pvc.Spec.StorageClassName != nil && *pvc.Spec.StorageClassName != "")
}
