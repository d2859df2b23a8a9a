package volumes

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/podfacts"
)

// indexClaim indexes pods by the claims they use, as NAMESPACE/NAME.
const indexClaim = "claim"

// buildEnds ends the volume of a claim owned by a pod as soon as that pod
// has ended, on this node: the claim cannot outlive its pod, so the pod's
// end is the build's end. Waiting for the claim to go away instead would
// wait as long as users keep completed pods (hours), and deleting it early
// would fight the controllers that own it (the ephemeral-volume controller
// recreates the claim of a pod that still exists).
//
// Claims that outlive one pod (a workspace a PipelineRun owns, a standalone
// claim reused by Job retries) are not touched here: they end when they are
// released, through Provisioner.Delete.
//
// The queue holds claims (NAMESPACE/NAME). Pod events only queue them: the
// claim and its PV are looked up by the workers, which start once every
// informer has synced, so a pod seen before its claim or PV is not lost.
type buildEnds struct {
	prov   *Provisioner
	kube   kubernetes.Interface
	pods   cache.Indexer // this node's pods
	claims corelisters.PersistentVolumeClaimLister
	pvs    corelisters.PersistentVolumeLister // this node's PVs
	queue  *kit.KeyQueue
	// seen keeps the outcome of pods that ended and went away, by claim,
	// until the claim's PV is deleted: Delete then ends the volume as the
	// pod did.
	seen *outcomes
}

// outcomes is a small concurrent map of claim (NAMESPACE/NAME) to the
// outcome of the pod that owned it.
type outcomes struct {
	mu sync.Mutex
	m  map[string]string
}

func newOutcomes() *outcomes { return &outcomes{m: map[string]string{}} }

func (o *outcomes) set(claim, outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.m[claim] = outcome
}

// get returns the outcome seen for claim; "" if none, or on a nil map.
func (o *outcomes) get(claim string) string {
	if o == nil {
		return ""
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.m[claim]
}

// retain keeps only the outcomes whose keys keep accepts.
func (o *outcomes) retain(keep func(key string) bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k := range o.m {
		if !keep(k) {
			delete(o.m, k)
		}
	}
}

func (o *outcomes) forget(claim string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, claim)
}

// claimKey is the key of the claim a PV is bound to, "" for none.
func claimKey(pv *corev1.PersistentVolume) string {
	if pv.Spec.ClaimRef == nil {
		return ""
	}
	return pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name
}

// podOutcome is the outcome of a pod as the node agent records it: the
// phase the pod ends in (podfacts.FinalPhase), "" while not known.
func podOutcome(pod *corev1.Pod) string {
	switch podfacts.FinalPhase(pod) {
	case corev1.PodSucceeded:
		return v1alpha1.OutcomeSucceeded
	case corev1.PodFailed:
		return v1alpha1.OutcomeFailed
	}
	return ""
}

// podClaims lists the claims a pod uses as NAMESPACE/NAME.
func podClaims(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var keys []string
	for _, c := range podfacts.Claims(pod) {
		keys = append(keys, pod.Namespace+"/"+c.Name)
	}
	return keys, nil
}

// handlers are the pod informer's event handlers: a pod that ended, or
// went away, queues the claims it used.
func (b *buildEnds) handlers() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); ok && podfacts.Ended(pod) {
				b.queueClaims(pod, false)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*corev1.Pod)
			pod, ok2 := obj.(*corev1.Pod)
			if ok1 && ok2 && podfacts.Ended(pod) && !podfacts.Ended(old) {
				b.queueClaims(pod, false)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				b.queueClaims(pod, true)
			}
		},
	}
}

// queueClaims queues the claims of a pod that ended, or went away (gone).
// For a pod that went away after it ended it remembers the outcome of its
// generic ephemeral volumes' claims, which are its own; a pod deleted
// before it ended leaves the outcome unknown.
func (b *buildEnds) queueClaims(pod *corev1.Pod, gone bool) {
	for _, c := range podfacts.Claims(pod) {
		key := pod.Namespace + "/" + c.Name
		if gone && c.Owned && podfacts.Ended(pod) {
			b.seen.set(key, podOutcome(pod))
		}
		b.queue.Add(key)
	}
}

// run works the queue with workers goroutines until ctx ends.
func (b *buildEnds) run(ctx context.Context, workers int) {
	kit.WorkKeys(ctx, b.queue, workers, "Ending the volume of an ended pod; retrying", "claim", b.end)
}

// end ends the volume of claim key if a pod owns the claim, and that pod
// and every other pod of this node that uses the claim have ended (or
// gone).
func (b *buildEnds) end(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	claim, err := b.claims.PersistentVolumeClaims(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil // the claim went away; its PV is released and Delete ends it
	}
	if err != nil {
		return err
	}
	owner, ok := podfacts.OwningPod(claim)
	if !ok || claim.Spec.VolumeName == "" {
		return nil
	}
	pv, err := b.pvs.Get(claim.Spec.VolumeName)
	if apierrors.IsNotFound(err) {
		return nil // not a volume of this node
	}
	if err != nil {
		return err
	}
	if pv.Annotations[v1alpha1.AnnotationResult] != "" || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != claim.UID ||
		pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed {
		b.prov.holds.released(namespace, owner.Name)
		return nil // ended already, or released: Delete ends it
	}
	outcome, ok := b.outcome(claim, owner.UID)
	if !ok {
		return nil // a pod still uses it; its end queues the claim again
	}
	res, err := b.prov.end(ctx, pv, endCause{Outcome: outcome, Trigger: triggerPod, Subject: claim})
	if err != nil {
		return err
	}
	b.prov.holds.released(namespace, owner.Name)
	if res.Result == "" {
		return nil
	}
	return b.record(ctx, pv.Name, res)
}

// outcome returns the outcome of the claim's owner and false while any pod
// of this node that uses the claim has not ended. The store's own busy
// check cannot see a build that still runs: containers reach the volume
// through bind mounts in their own mount namespaces, which keep the overlay
// alive after the agent unmounts its view. So only the kubelet's word that
// every container stopped for good (podfacts.Ended) makes a commit safe.
func (b *buildEnds) outcome(claim *corev1.PersistentVolumeClaim, owner types.UID) (string, bool) {
	key := claim.Namespace + "/" + claim.Name
	objs, _ := b.pods.ByIndex(indexClaim, key)
	outcome := b.seen.get(key)
	for _, obj := range objs {
		pod := obj.(*corev1.Pod)
		if !podfacts.Ended(pod) {
			return "", false
		}
		if pod.UID == owner {
			outcome = podOutcome(pod)
		}
	}
	return outcome, true
}

// record writes what became of the volume on its PV, where an operator
// looks (kubectl get pv -o yaml), and where the agent sees after a restart
// that the volume already ended.
func (b *buildEnds) record(ctx context.Context, pv string, res ended) error {
	ann := map[string]string{v1alpha1.AnnotationResult: res.Result}
	if res.Outcome != "" {
		ann[v1alpha1.AnnotationPodOutcome] = res.Outcome
	}
	if res.Result == v1alpha1.ResultCommitted {
		ann[v1alpha1.AnnotationCommittedGeneration] = strconv.FormatInt(res.Generation, 10)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	_, err = b.kube.CoreV1().PersistentVolumes().Patch(ctx, pv, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: kit.Component})
	if err != nil && !apierrors.IsNotFound(err) {
		// The volume has ended; only the record is missing. Retrying the
		// whole end would find the volume gone and record nothing, so log.
		log.FromContext(ctx).Error(err, "Recording the end of a volume on its PV", "pv", pv, "result", res.Result)
	}
	return nil
}
