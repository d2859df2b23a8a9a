package volumes

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/podfacts"
)

// csiEnds ends CSI volumes when their pods end: at the kubelet's unpublish,
// when the pod watch sees the pod end or go, or at the periodic sweep
// (which also catches what happened while the agent was down), whichever
// comes first. The store ends a volume once: after a commit or discard it
// is gone, and every later attempt finds nothing to do.
type csiEnds struct {
	prov *Provisioner
	// locks are the CSI driver's: an end and the kubelet's calls for the
	// same volume take turns.
	locks *volumeLocks
	// pods is the informer's store of this node's pods.
	pods  cache.Indexer
	queue *kit.KeyQueue
	// seen keeps the outcome of pods that ended and went away before
	// their volumes ended, by pod UID.
	seen *outcomes
}

func newCSIEnds(prov *Provisioner, locks *volumeLocks, pods cache.Indexer) *csiEnds {
	return &csiEnds{prov: prov, locks: locks, pods: pods, seen: newOutcomes(), queue: kit.NewKeyQueue("csi-end")}
}

// handlers queue the pods that end or go away. Pods without a layercache
// CSI volume are skipped without a look at the store.
func (e *csiEnds) handlers() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); ok && podfacts.Ended(pod) && usesCSI(pod) {
				e.queue.Add(pod.Namespace + "/" + pod.Name)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*corev1.Pod)
			pod, ok2 := obj.(*corev1.Pod)
			if ok1 && ok2 && podfacts.Ended(pod) && !podfacts.Ended(old) && usesCSI(pod) {
				e.queue.Add(pod.Namespace + "/" + pod.Name)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			pod, ok := obj.(*corev1.Pod)
			if !ok || !usesCSI(pod) {
				return
			}
			if podfacts.Ended(pod) {
				e.seen.set(string(pod.UID), podOutcome(pod))
			}
			e.queue.Add(pod.Namespace + "/" + pod.Name)
		},
	}
}

// usesCSI tells whether the pod has a layercache CSI inline volume.
func usesCSI(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.CSI != nil && v.CSI.Driver == v1alpha1.CSIDriverName {
			return true
		}
	}
	return false
}

// run sweeps every CSI volume of the store now and then every interval,
// and works the queue with workers goroutines, until ctx ends.
func (e *csiEnds) run(ctx context.Context, workers int, interval time.Duration) {
	go kit.WorkKeys(ctx, e.queue, workers, "Ending the CSI volumes of a pod; retrying", "pod", e.endPod)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := e.sweep(ctx); err != nil {
			log.FromContext(ctx).Error(err, "Sweeping CSI volumes")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// endPod ends the store's CSI volumes of pod key whose pod is decided.
func (e *csiEnds) endPod(ctx context.Context, key string) error {
	return e.endPods(ctx, func(v layerfs.Volume) bool {
		return v.Labels[labelPodNamespace]+"/"+v.Labels[labelPodName] == key
	})
}

// endPods ends the store's CSI volumes that match and whose pods are
// decided.
func (e *csiEnds) endPods(ctx context.Context, match func(layerfs.Volume) bool) error {
	vols, err := e.csiVolumes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vols {
		if match(v) {
			errs = append(errs, e.endLocked(ctx, v.ID, triggerPod))
		}
	}
	return errors.Join(errs...)
}

// sweep ends every CSI volume whose pod is decided, and forgets the
// outcomes of pods with no volume in the store: a pod deleted after its
// volume ended leaves one behind.
func (e *csiEnds) sweep(ctx context.Context) error {
	vols, err := e.csiVolumes(ctx)
	if err != nil {
		return err
	}
	open := map[string]bool{}
	for _, v := range vols {
		open[v.Labels[labelPodUID]] = true
	}
	e.seen.retain(func(uid string) bool { return open[uid] })
	var errs []error
	for _, v := range vols {
		errs = append(errs, e.endLocked(ctx, v.ID, triggerPod))
	}
	return errors.Join(errs...)
}

// csiVolumes lists the store's CSI volumes.
func (e *csiEnds) csiVolumes(ctx context.Context) ([]layerfs.Volume, error) {
	vols, err := e.prov.store.Volumes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return slices.DeleteFunc(vols, func(v layerfs.Volume) bool {
		return !strings.HasPrefix(v.ID, csiVolumePrefix) || v.Labels[labelCSIVolume] == ""
	}), nil
}

// endLocked ends one volume under its lock, read again there: the
// kubelet's unpublish may have ended it meanwhile.
func (e *csiEnds) endLocked(ctx context.Context, id, trigger string) error {
	unlock := e.locks.lock(id)
	defer unlock()
	vol, err := e.prov.store.Volume(ctx, id)
	if errors.Is(err, layerfs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return e.endIfDecided(ctx, vol, trigger)
}

// endIfDecided ends the volume if its pod's outcome is decided: the pod
// ended for good, or it is gone and the kubelet has unmounted the volume
// (a pod deleted with --force may still run on the node until then). The
// caller holds the volume's lock.
func (e *csiEnds) endIfDecided(ctx context.Context, vol *layerfs.Volume, trigger string) error {
	pod := kit.CSIPod{Namespace: vol.Labels[labelPodNamespace], Name: vol.Labels[labelPodName], UID: types.UID(vol.Labels[labelPodUID])}
	target := vol.Labels[labelCSITarget]
	outcome, state, err := e.outcome(ctx, pod, trigger == triggerUnpublish)
	if err != nil || state == podRunning {
		return err
	}
	if trigger != triggerUnpublish {
		if state == podGone {
			// A pod deleted with --force may still run on the node until the
			// kubelet has stopped it and unpublished the volume.
			// The kubelet removes the pod's directory once it has
			// unpublished: a target that is gone is not mounted.
			mounted, err := mountinfo.Mounted(target)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if mounted {
				return nil
			}
		}
		// The pod has stopped for good, but the kubelet has not unpublished
		// yet: the agent unmounts the target itself, so that the view the
		// commit seals has no other mount.
		if err := unbindTarget(target); err != nil {
			return err
		}
	}
	rec := provisioned{Cache: vol.Cache, Mode: v1alpha1.ModeWrite, Commit: v1alpha1.CommitPolicy(vol.Labels[labelCommit])}
	if vol.ReadOnly {
		rec.Mode = v1alpha1.ModeRead
	}
	logger := log.FromContext(ctx).WithValues("volume", vol.ID, "pod", pod.Key())
	if class := vol.Labels[labelStorageClass]; class != "" {
		logger = logger.WithValues("storageClass", class)
	}
	ctx = log.IntoContext(ctx, logger)
	if _, err := e.prov.endVolume(ctx, vol.ID, rec, endCause{Outcome: outcome, Trigger: trigger, Subject: pod.Object()}); err != nil {
		return err
	}
	e.prov.holds.released(pod.Namespace, pod.Name)
	e.seen.forget(string(pod.UID))
	return nil
}

// What the agent knows of a CSI volume's pod.
type podState int

const (
	podRunning podState = iota // some container may still run
	podEnded                   // every container stopped for good
	podGone                    // deleted, or replaced by a pod of the same name
)

// ended tells, from the informer, whether pod p's build has ended: its
// containers stopped for good, or it went away after that.
func (e *csiEnds) ended(p kit.CSIPod) bool {
	if obj, ok, _ := e.pods.GetByKey(p.Key()); ok {
		if pod := obj.(*corev1.Pod); pod.UID == p.UID && podfacts.Ended(pod) {
			return true
		}
	}
	return e.seen.get(string(p.UID)) != ""
}

// outcome tells the state of the volume's pod and, once it ended, its
// outcome. The informer answers for pods it has; a pod it lacks is looked
// up in the API server before it counts as gone, and so is a running pod
// when fresh asks for it (the kubelet unpublishes as soon as the
// containers stop, and its status update may still be on the way).
func (e *csiEnds) outcome(ctx context.Context, p kit.CSIPod, fresh bool) (string, podState, error) {
	var pod *corev1.Pod
	if obj, ok, _ := e.pods.GetByKey(p.Key()); ok {
		if cached := obj.(*corev1.Pod); cached.UID == p.UID {
			pod = cached
		}
	}
	if pod == nil || (fresh && !podfacts.Ended(pod)) {
		got, err := e.prov.getPod(ctx, p.Namespace, p.Name)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && got.UID != p.UID):
			return e.seen.get(string(p.UID)), podGone, nil
		case err != nil:
			return "", podRunning, fmt.Errorf("get pod %s: %w", p.Key(), err)
		}
		pod = got
	}
	if !podfacts.Ended(pod) {
		return "", podRunning, nil
	}
	return podOutcome(pod), podEnded, nil
}
