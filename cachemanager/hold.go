package cachemanager

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

// indexHeldPods indexes the pods a node agent holds (finalizer
// v1alpha1.FinalizerBuildEnd) by their node.
const indexHeldPods = "layercache.dev/held-pods"

// HoldReconciler lifts the node agents' hold on the pods no agent will
// release. A node agent holds a build pod until the pod's volumes have
// ended, and only the agent of the pod's node lifts it. A Node that is
// gone (a spot instance reclaimed, a node pool scaled down while pods
// ran) takes its agent and its store along, and a pod deleted before the
// scheduler bound it (an agent holds the owner of a claim as it
// provisions the claim) is on no node: either would stay Terminating for
// ever.
type HoldReconciler struct {
	// Client reads from the informer cache (Nodes as metadata only) and
	// writes to the API server.
	Client client.Client
	// APIReader confirms, past the informer cache, what a lift rests on:
	// a Node just created (an autoscaler adding nodes as pods land on
	// them) may not be in the cache yet, nor a pod's binding.
	APIReader client.Reader
	Recorder  events.EventRecorder
}

// SetupWithManager wires the controller: a held pod is reconciled when it
// changes and when its Node is deleted.
func (r *HoldReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("hold").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return heldPod(o) }))).
		WatchesMetadata(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.heldPodsOfNode), builder.WithPredicates(nodeDeleted)).
		Complete(r)
}

func heldPod(o client.Object) bool {
	return slices.Contains(o.GetFinalizers(), v1alpha1.FinalizerBuildEnd)
}

func heldPodsIndex(obj client.Object) []string {
	pod, ok := obj.(*corev1.Pod)
	if !ok || !heldPod(pod) || pod.Spec.NodeName == "" {
		return nil
	}
	return []string{pod.Spec.NodeName}
}

func (r *HoldReconciler) heldPodsOfNode(ctx context.Context, node client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.MatchingFields{indexHeldPods: node.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing the held pods of a deleted Node", "node", node.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(pods.Items))
	for _, p := range pods.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
	}
	return reqs
}

// Reconcile lifts the hold of a pod whose Node does not exist.
func (r *HoldReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pod corev1.Pod
	if err := r.Client.Get(ctx, req.NamespacedName, &pod); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !heldPod(&pod) {
		return reconcile.Result{}, nil
	}
	if pod.Spec.NodeName == "" && pod.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	gone, err := r.nodeGone(ctx, &pod)
	if err != nil || !gone {
		return reconcile.Result{}, err
	}
	if pod.Spec.NodeName == "" {
		// It never ran: there is no build to end.
		return reconcile.Result{}, r.lift(ctx, &pod, "was deleted before it was bound to a node, so it ran no build")
	}
	return reconcile.Result{}, r.lift(ctx, &pod, fmt.Sprintf("ran on Node %s, which no longer exists, so its layercache agent cannot end the pod's cache volumes: their changes are lost with the node", pod.Spec.NodeName))
}

// nodeGone tells whether no agent will release the held pod: it is bound
// to no node, or its Node does not exist, as the informer cache and then
// the API server say. pod becomes the API server's copy.
func (r *HoldReconciler) nodeGone(ctx context.Context, pod *corev1.Pod) (bool, error) {
	if pod.Spec.NodeName != "" && nodeExists(ctx, r.Client, pod.Spec.NodeName) {
		return false, nil
	}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if !heldPod(pod) {
		return false, nil
	}
	return pod.Spec.NodeName == "" || !nodeExists(ctx, r.APIReader, pod.Spec.NodeName), nil
}

// nodeExists tells whether reader has Node name; an error other than
// NotFound counts as existing, so that only a sure answer lifts a hold
// or deletes a replica.
func nodeExists(ctx context.Context, reader client.Reader, name string) bool {
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return !apierrors.IsNotFound(reader.Get(ctx, types.NamespacedName{Name: name}, node))
}

// lift removes the hold of a pod that why explains, with a Warning Event.
func (r *HoldReconciler) lift(ctx context.Context, pod *corev1.Pod, why string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": pod.UID, "$deleteFromPrimitiveList/finalizers": []string{v1alpha1.FinalizerBuildEnd},
	}})
	if err != nil {
		return err
	}
	if err := r.Client.Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, body)); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return fmt.Errorf("lifting finalizer %s: %w", v1alpha1.FinalizerBuildEnd, err)
	}
	r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, "BuildEndLost", "Release", "The pod %s; finalizer %s is lifted", why, v1alpha1.FinalizerBuildEnd)
	log.FromContext(ctx).Info("lifted the hold of a pod", "node", pod.Spec.NodeName, "why", why)
	return nil
}
