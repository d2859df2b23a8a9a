package cachemanager

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/podfacts"
)

// The outcome of a standalone claim's build: decided from its ended pods
// (the last attempt), recorded on its PV for the node agent, which acts on
// it once the claim is gone.

// outcomeOf decides the outcome of ended pods: failed if any pod of the last
// attempt failed. The last attempt is the pod that started last and every
// pod still running when it started. Pods that ended before it are earlier
// attempts (a Job's retries on one claim) that the last one supersedes.
// deciding lists the pods of the last attempt, the newest first.
func outcomeOf(ended []*corev1.Pod) (outcome string, deciding []*corev1.Pod) {
	var last time.Time
	for _, p := range ended {
		if s := startedAt(p); s.After(last) {
			last = s
		}
	}
	outcome = v1alpha1.OutcomeSucceeded
	for _, p := range ended {
		if f, ok := finishedAt(p); ok && f.Before(last) {
			continue
		}
		deciding = append(deciding, p)
		if podfacts.FinalPhase(p) == corev1.PodFailed {
			outcome = v1alpha1.OutcomeFailed
		}
	}
	slices.SortStableFunc(deciding, func(a, b *corev1.Pod) int { return startedAt(b).Compare(startedAt(a)) })
	return outcome, deciding
}

func startedAt(p *corev1.Pod) time.Time {
	if p.Status.StartTime != nil {
		return p.Status.StartTime.Time
	}
	return p.CreationTimestamp.Time
}

// finishedAt is when the pod's last container ended; false if no container
// reports it.
func finishedAt(p *corev1.Pod) (time.Time, bool) {
	var last time.Time
	for _, statuses := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, s := range statuses {
			if t := s.State.Terminated; t != nil && t.FinishedAt.After(last) {
				last = t.FinishedAt.Time
			}
		}
	}
	return last, !last.IsZero()
}

// recordOutcome writes the outcome on the claim's PV. The node agent acts on
// the PV only once it is released, after the claim is gone, so the outcome
// may still change until then.
func (r *ReleaseReconciler) recordOutcome(ctx context.Context, pvc *corev1.PersistentVolumeClaim, outcome string, deciding []*corev1.Pod) (reconcile.Result, error) {
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase == corev1.ClaimLost {
		return reconcile.Result{}, nil
	}
	var pv corev1.PersistentVolume
	if err := r.Client.Get(ctx, types.NamespacedName{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{RequeueAfter: cacheLagWait}, nil
		}
		return reconcile.Result{}, fmt.Errorf("reading PersistentVolume %s of claim %s/%s: %w", pvc.Spec.VolumeName, pvc.Namespace, pvc.Name, err)
	}
	if !isOurVolume(&pv) || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
		log.FromContext(ctx).V(1).Info("volume is not a layercache volume of this claim; not recording the outcome", "volume", pv.Name)
		return reconcile.Result{}, nil
	}
	recorded := pv.Annotations[v1alpha1.AnnotationPodOutcome]
	if recorded == outcome {
		return reconcile.Result{}, nil
	}
	attempt := startedAt(deciding[0])
	if keepsFailure(pvc, &pv, outcome, attempt) {
		log.FromContext(ctx).V(1).Info("keeping the failed outcome: no newer attempt succeeded, the failed one's pods only went away", "volume", pv.Name)
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(pv.DeepCopy())
	metav1.SetMetaDataAnnotation(&pv.ObjectMeta, v1alpha1.AnnotationPodOutcome, outcome)
	metav1.SetMetaDataAnnotation(&pv.ObjectMeta, annOutcomeAttempt, attempt.UTC().Format(time.RFC3339Nano))
	if err := r.Client.Patch(ctx, &pv, patch); err != nil {
		return reconcile.Result{}, fmt.Errorf("recording outcome %s on PersistentVolume %s: %w", outcome, pv.Name, err)
	}
	r.Metrics.recordedOutcomes.WithLabelValues(outcome).Inc()
	r.Recorder.Eventf(pvc, deciding[0], corev1.EventTypeNormal, "OutcomeRecorded", "RecordOutcome",
		"Recorded pod outcome %s on PersistentVolume %s (%s)", outcome, pv.Name, podNames(deciding))
	return reconcile.Result{}, nil
}

// annOutcomeAttempt on a PV is when the newest pod of the attempt that
// decided the recorded outcome started.
const annOutcomeAttempt = "layercache.dev/pod-outcome-attempt"

// keepsFailure tells whether a failure recorded on pv stands against
// outcome, a success of an attempt whose newest pod started at attempt.
// Only a newer attempt (a Job's retry on the claim) turns a failure into a
// success. The garbage collector deletes an owner's pods and its claims at
// once (a Workflow or PipelineRun being deleted), and the failed pod can
// leave the cache before the succeeded ones and before the claim is seen
// going: what is left then is the same attempt seen shrinking, not a newer
// one. A claim being deleted can get no newer attempt at all.
func keepsFailure(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, outcome string, attempt time.Time) bool {
	if pv.Annotations[v1alpha1.AnnotationPodOutcome] != v1alpha1.OutcomeFailed || outcome != v1alpha1.OutcomeSucceeded {
		return false
	}
	if !pvc.DeletionTimestamp.IsZero() {
		return true
	}
	failed, err := time.Parse(time.RFC3339Nano, pv.Annotations[annOutcomeAttempt])
	return err == nil && !attempt.After(failed)
}
