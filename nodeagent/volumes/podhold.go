package volumes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/podfacts"
)

// podHolds keeps the build pods of this node in the API until their
// volumes have ended, with finalizer v1alpha1.FinalizerBuildEnd, as the
// Job controller keeps its pods until it has counted them. The API server
// deletes a terminal pod at once, and CI systems delete pods as soon as
// they end: while the agent is away (restarted, upgraded, killed), such a
// pod would take its outcome with it, and an on-success build would be
// discarded. Held, it stays Terminating until the agent is back.
//
// A pod is held before its volume is handed out: at the provisioning of
// a claim it owns, and at the publish of a CSI inline volume. A pod of a
// standalone claim released on pod exit is held by the pod watch while it
// runs, and released once the manager has recorded its outcome. Neither
// completes until the hold is in place, so no build runs unheld, even
// through an API server outage. The pod watch holds, as a backstop, a pod
// of this node that runs with such a volume and no hold (an agent of an
// older version provisioned it). A pod is released once it has ended and
// none of those volumes is left in the store. The agent releases the
// pods of its node, which its informer sees; the manager those that are
// deleted before they were bound to a node, or whose Node is gone.
type podHolds struct {
	store  kit.Store
	kube   kubernetes.Interface
	pods   cache.Indexer // this node's pods
	claims corelisters.PersistentVolumeClaimLister
	pvs    corelisters.PersistentVolumeLister // this node's PVs
	queue  *kit.KeyQueue
}

func newPodHolds(st kit.Store, kube kubernetes.Interface, pods cache.Indexer, claims corelisters.PersistentVolumeClaimLister, pvs corelisters.PersistentVolumeLister) *podHolds {
	return &podHolds{store: st, kube: kube, pods: pods, claims: claims, pvs: pvs,
		queue: kit.NewKeyQueue("pod-hold")}
}

// handlers queue every pod that may need a hold or a release; the check
// itself is cheap and local.
func (h *podHolds) handlers() cache.ResourceEventHandler {
	add := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok && (usesCSI(pod) || len(podfacts.Claims(pod)) > 0 || held(pod)) {
			h.queue.Add(pod.Namespace + "/" + pod.Name)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(_, obj any) { add(obj) },
	}
}

// released asks for a pod's release once one of its volumes has ended.
func (h *podHolds) released(namespace, name string) {
	h.queue.Add(namespace + "/" + name)
}

// volumeHandlers ask for the release of a standalone claim's pods once
// the manager has recorded their outcome on the claim's PV.
func (h *podHolds) volumeHandlers() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			pv, ok := obj.(*corev1.PersistentVolume)
			if !ok || pv.Spec.ClaimRef == nil || pv.Annotations[v1alpha1.AnnotationPodOutcome] == "" {
				return
			}
			objs, _ := h.pods.ByIndex(indexClaim, pv.Spec.ClaimRef.Namespace+"/"+pv.Spec.ClaimRef.Name)
			for _, o := range objs {
				if pod, ok := o.(*corev1.Pod); ok && held(pod) {
					h.released(pod.Namespace, pod.Name)
				}
			}
		},
	}
}

// run works the queue with workers goroutines until ctx ends.
func (h *podHolds) run(ctx context.Context, workers int) {
	kit.WorkKeys(ctx, h.queue, workers, "Holding or releasing a build pod; retrying", "pod", h.sync)
}

// sync holds or releases one pod, as its state and its volumes say.
func (h *podHolds) sync(ctx context.Context, key string) error {
	obj, ok, err := h.pods.GetByKey(key)
	if err != nil || !ok {
		return err
	}
	pod := obj.(*corev1.Pod)
	// The store is read only when a patch may follow: a pod's status
	// changes many times while it runs.
	var hold bool
	switch {
	case !held(pod) && !podfacts.Ended(pod) && pod.DeletionTimestamp == nil:
		hold = true
	case held(pod) && (podfacts.Ended(pod) || !h.usesVolumes(pod)):
		hold = false
	default:
		return nil
	}
	open, err := h.openVolumes(ctx, pod)
	if err != nil || open != hold {
		return err
	}
	return h.patch(ctx, pod, hold)
}

// held tells whether the pod has the agent's finalizer.
func held(pod *corev1.Pod) bool {
	return slices.Contains(pod.Finalizers, v1alpha1.FinalizerBuildEnd)
}

// usesVolumes tells whether the pod has a volume its outcome decides.
func (h *podHolds) usesVolumes(pod *corev1.Pod) bool {
	return usesCSI(pod) || len(h.outcomeVolumes(pod)) > 0
}

// outcomeVolumes are this node's PVs of the pod's claims whose volumes its
// outcome decides: the claims it owns, which the agent ends at the pod's
// end, and standalone claims released on pod exit, whose outcome the
// manager records on the PV before it releases the claim (a manager that
// is away, or failing over, must still find the pod).
func (h *podHolds) outcomeVolumes(pod *corev1.Pod) []outcomeVolume {
	var vols []outcomeVolume
	for _, c := range podfacts.Claims(pod) {
		claim, err := h.claims.PersistentVolumeClaims(pod.Namespace).Get(c.Name)
		if err != nil || claim.Spec.VolumeName == "" {
			continue
		}
		owner, owned := podfacts.OwningPod(claim)
		if owned && owner.UID != pod.UID || !owned && claim.Annotations[v1alpha1.AnnotationRelease] != v1alpha1.ReleaseOnPodExit {
			continue
		}
		if pv, err := h.pvs.Get(claim.Spec.VolumeName); err == nil {
			vols = append(vols, outcomeVolume{pv: pv, standalone: !owned})
		}
	}
	return vols
}

// outcomeVolume is a PV whose volume the pod's outcome decides.
type outcomeVolume struct {
	pv         *corev1.PersistentVolume
	standalone bool // of a standalone claim, which the manager releases
}

// decided tells whether the manager has recorded the outcome of a
// standalone claim's pods on its PV.
func (v outcomeVolume) decided() bool {
	return v.standalone && v.pv.Annotations[v1alpha1.AnnotationPodOutcome] != ""
}

// openVolumes tells whether a volume of the pod's outcome is still in the
// store: the store is the truth, as an ended volume leaves it at once. A
// standalone claim's volume no longer needs the pod once the manager has
// recorded its pods' outcome on the PV.
func (h *podHolds) openVolumes(ctx context.Context, pod *corev1.Pod) (bool, error) {
	for _, v := range h.outcomeVolumes(pod) {
		if v.decided() {
			continue
		}
		_, err := h.store.Volume(ctx, v.pv.Name)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, layerfs.ErrNotFound) {
			return false, fmt.Errorf("read volume %s: %w", v.pv.Name, err)
		}
	}
	if !usesCSI(pod) {
		return false, nil
	}
	vols, err := h.store.Volumes(ctx)
	if err != nil {
		return false, fmt.Errorf("list volumes: %w", err)
	}
	return slices.ContainsFunc(vols, func(v layerfs.Volume) bool { return v.Labels[labelPodUID] == string(pod.UID) }), nil
}

// hold holds pod namespace/name, unless the informer shows it held.
func (h *podHolds) hold(ctx context.Context, namespace, name string, uid types.UID) error {
	if obj, ok, _ := h.pods.GetByKey(namespace + "/" + name); ok {
		if pod := obj.(*corev1.Pod); pod.UID == uid && held(pod) {
			return nil
		}
	}
	return h.patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uid}}, true)
}

// podUID is the UID of pod key (namespace/name) as this node's informer
// has it, if it has the pod.
func (h *podHolds) podUID(key string) (types.UID, bool) {
	obj, ok, _ := h.pods.GetByKey(key)
	if !ok {
		return "", false
	}
	return obj.(*corev1.Pod).UID, true
}

// patch adds (hold) or removes the finalizer with a strategic merge patch,
// which leaves other finalizers alone; the UID makes it a precondition
// that the pod is still the one the informer saw.
func (h *podHolds) patch(ctx context.Context, pod *corev1.Pod, hold bool) error {
	meta := map[string]any{"uid": pod.UID}
	if hold {
		meta["finalizers"] = []string{v1alpha1.FinalizerBuildEnd}
	} else {
		meta["$deleteFromPrimitiveList/finalizers"] = []string{v1alpha1.FinalizerBuildEnd}
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	_, err = h.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{FieldManager: kit.Component})
	verb := "remove"
	if hold {
		verb = "add"
	}
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil // gone, or replaced by a pod of the same name
	case hold && apierrors.IsForbidden(err) && isBeingDeleted(err):
		return nil // deleted meanwhile: no finalizer may be added any more
	case err != nil:
		return fmt.Errorf("%s finalizer %s on pod %s/%s: %w", verb, v1alpha1.FinalizerBuildEnd, pod.Namespace, pod.Name, err)
	}
	log.FromContext(ctx).V(1).Info("Build pod", "pod", pod.Namespace+"/"+pod.Name, "held", hold)
	return nil
}

// isBeingDeleted tells the API server's refusal to add a finalizer to an
// object that is being deleted.
func isBeingDeleted(err error) bool {
	return strings.Contains(err.Error(), "being deleted")
}
