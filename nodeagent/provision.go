package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/podfacts"
)

// annSelectedNode is set by the scheduler on a late-binding claim.
const annSelectedNode = "volume.kubernetes.io/selected-node"

// store is the part of *layerfs.Store the agent uses.
type store interface {
	Mount(ctx context.Context, volumeID string, opts layerfs.MountOptions) (*layerfs.Volume, error)
	Commit(ctx context.Context, volumeID string) (layerfs.CommitResult, error)
	Discard(ctx context.Context, volumeID string) error
	Volume(ctx context.Context, volumeID string) (*layerfs.Volume, error)
	Squash(ctx context.Context, cache layerfs.CacheRef, maxLayers int) (layerfs.SquashResult, error)
	GC(ctx context.Context, opts layerfs.GCOptions) (layerfs.GCResult, error)
	Remove(ctx context.Context, cache layerfs.CacheRef) error
	RemoveIfUnused(ctx context.Context, cache layerfs.CacheRef) (bool, error)
	List(ctx context.Context) ([]layerfs.CacheInfo, error)
	Inspect(ctx context.Context, cache layerfs.CacheRef) (layerfs.CacheInfo, error)
	Recover(ctx context.Context) (layerfs.RecoverResult, error)
	HasControlFile(ctx context.Context, volumeID, name string) (bool, error)
	HasChanges(ctx context.Context, volumeID string) (bool, error)
	ExportLayer(ctx context.Context, cache layerfs.CacheRef, layerID string, w io.Writer) error
	SetLayerDigest(ctx context.Context, cache layerfs.CacheRef, layerID, digest string) error
	Sync(ctx context.Context, cache layerfs.CacheRef, chain layerfs.Chain, fetch layerfs.Fetch, opts layerfs.SyncOptions) (layerfs.SyncResult, error)
}

// podGetter reads a pod from the API server. Provision needs the pod that
// owns a claim before the scheduler binds it to this node, so the agent's
// informer of this node's pods does not have it yet.
type podGetter func(ctx context.Context, namespace, name string) (*corev1.Pod, error)

// Provisioner provisions and deletes the layercache volumes of one node.
type Provisioner struct {
	node     string
	hostname string
	store    store
	caches   *caches
	events   events.EventRecorder
	metrics  *metrics
	getPod   podGetter
	// seen has the outcomes of pods that ended and went away before their
	// volumes ended; nil when the agent does not watch pods.
	seen *outcomes
	// reports and squashes run off the critical path; nil in tests that
	// don't look at them.
	reports  *cacheQueue
	squashes *cacheQueue
	// sync keeps caches whose class names a registry in step across
	// nodes.
	sync *syncer
}

var (
	_ controller.Provisioner   = (*Provisioner)(nil)
	_ controller.Qualifier     = (*Provisioner)(nil)
	_ controller.DeletionGuard = (*Provisioner)(nil)
)

// ShouldProvision takes the claims the scheduler placed on this node. A
// claim without a selected node reaches Provision only if its class binds
// immediately, which Provision then refuses with an explanation.
func (p *Provisioner) ShouldProvision(_ context.Context, claim *corev1.PersistentVolumeClaim) bool {
	node, ok := claim.Annotations[annSelectedNode]
	return !ok || node == "" || node == p.node
}

// ShouldDelete takes only the PVs this node provisioned.
func (p *Provisioner) ShouldDelete(_ context.Context, pv *corev1.PersistentVolume) bool {
	return pv.Annotations[v1alpha1.AnnotationNode] == p.node
}

// Provision validates the claim, mounts a copy-on-write view of its cache
// and returns a hostPath PV pinned to this node. Calling it again for the
// same claim returns the same volume.
func (p *Provisioner) Provision(ctx context.Context, opts controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	claim := opts.PVC
	logger := log.FromContext(ctx).WithValues("pvc", claim.Namespace+"/"+claim.Name, "pv", opts.PVName)
	if opts.SelectedNodeName != "" && opts.SelectedNodeName != p.node {
		return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: fmt.Sprintf("claim is for node %s, this is node %s", opts.SelectedNodeName, p.node)}
	}
	start := time.Now()
	req, err := p.admit(ctx, claim, opts)
	if err != nil {
		var refused *claimError
		if errors.As(err, &refused) {
			p.events.Eventf(claim, nil, corev1.EventTypeWarning, refused.Reason, actionProvision, "%s", refused.Message)
			p.metrics.fail(opProvision, refused.Reason)
		} else {
			p.metrics.fail(opProvision, "api")
		}
		logger.Info("Claim refused", "reason", err.Error())
		// Finished: nothing runs in the background. The library retries with
		// backoff, which picks up a fixed claim, class or grant.
		return nil, controller.ProvisioningFinished, err
	}
	if req.ForcedRead {
		p.events.Eventf(claim, nil, corev1.EventTypeNormal, reasonModeForcedRead, actionProvision,
			"StorageClass %q makes every volume read-only, so the volume of cache %s is a read view that is never committed, although the claim asks for %s: %s",
			opts.StorageClass.Name, req.Cache, v1alpha1.AnnotationMode, v1alpha1.ModeWrite)
	}

	if req.Registry != nil {
		p.sync.pull(ctx, claim, req)
	}
	vol, err := p.store.Mount(ctx, opts.PVName, req.mountOptions())
	if err != nil {
		p.metrics.fail(opProvision, reasonMountFailed)
		return nil, controller.ProvisioningFinished, fmt.Errorf("mount volume %s of cache %s on node %s: %w", opts.PVName, req.Cache, p.node, err)
	}
	pv := buildPV(pvSpec{
		Name: opts.PVName, Node: p.node, Hostname: p.hostname,
		Request: req, Volume: vol, Claim: claim, Class: opts.StorageClass,
	})
	p.metrics.provisionSeconds.WithLabelValues(string(req.Mode)).Observe(time.Since(start).Seconds())
	if vol.BaseGeneration > 0 {
		p.metrics.hits.WithLabelValues(req.Cache.Namespace, req.Cache.Name).Inc()
	} else {
		p.metrics.misses.WithLabelValues(req.Cache.Namespace, req.Cache.Name).Inc()
	}
	p.reports.Add(req.Cache)
	logger.Info("Provisioned", "cache", req.Cache.String(), "mode", req.Mode, "commit", req.Commit,
		"baseGeneration", vol.BaseGeneration, "path", vol.MergedPath)
	return pv, controller.ProvisioningFinished, nil
}

// admit decides whether the claim may have a volume, and which.
func (p *Provisioner) admit(ctx context.Context, claim *corev1.PersistentVolumeClaim, opts controller.ProvisionOptions) (volumeRequest, error) {
	class, err := parseClass(opts.StorageClass)
	if err != nil {
		return volumeRequest{}, err
	}
	// parseClass refuses immediate binding, so a claim gets here with no
	// selected node only if the class changed under it.
	if opts.SelectedNodeName == "" {
		return volumeRequest{}, &claimError{Reason: reasonInvalidStorageClass,
			Message: fmt.Sprintf("claim has no selected node although StorageClass %q binds on first consumer; recreate the claim", opts.StorageClass.Name)}
	}
	var pod *corev1.Pod
	if class.needsPod(claim) {
		if pod, err = p.owningPod(ctx, claim); err != nil {
			return volumeRequest{}, err
		}
	}
	req, err := parseClaim(claim, class, pod)
	if err != nil {
		return req, err
	}
	return req, p.caches.authorize(ctx, claim.Namespace, req)
}

// Delete ends a released volume (see end) and lets the library delete its
// PV. A volume already ended at its pod's end is gone from the store, so
// this only cleans up; Delete is safe to call again after a failure or a
// restart.
func (p *Provisioner) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	if !p.ShouldDelete(ctx, pv) {
		return &controller.IgnoredError{Reason: fmt.Sprintf("PV %s belongs to node %q, this is node %s", pv.Name, pv.Annotations[v1alpha1.AnnotationNode], p.node)}
	}
	_, err := p.end(ctx, pv, endCause{Outcome: p.seen.get(claimKey(pv)), Trigger: triggerRelease, Subject: pv})
	return err
}

// What ended a build, for the ends metric.
const (
	triggerPod     = "pod"
	triggerRelease = "release"
)

// ended is what end did to a volume.
type ended struct {
	// Result is v1alpha1.ResultCommitted, ResultDiscarded or ResultDropped;
	// empty if the volume had already ended.
	Result     string
	Generation int64 // the cache's generation after a commit
	Outcome    string
}

// endCause is what ended a build, as end needs it.
type endCause struct {
	// Outcome is what the agent saw of the pods; "" to take the one
	// recorded on the PV.
	Outcome string
	Trigger string // triggerPod or triggerRelease
	// Subject is the object the Event goes on: the claim while it exists.
	Subject runtime.Object
}

// end commits or discards the volume of a build that ended, as its mode,
// its commit policy and the build's outcome say. A volume that is no
// longer in the store had already ended, and nothing is done.
func (p *Provisioner) end(ctx context.Context, pv *corev1.PersistentVolume, cause endCause) (ended, error) {
	logger := log.FromContext(ctx).WithValues("pv", pv.Name)
	rec, err := parsePV(pv)
	if err != nil {
		p.events.Eventf(pv, nil, corev1.EventTypeWarning, reasonInvalidVolume, actionEnd, "%s", err.Error())
		p.metrics.fail(opCommit, reasonInvalidVolume)
		return ended{}, err
	}
	if cause.Outcome != "" {
		rec.Outcome = cause.Outcome
	}
	if rec.Marker, err = p.readMarker(ctx, pv.Name, rec); errors.Is(err, layerfs.ErrNotFound) {
		return ended{}, nil
	} else if err != nil {
		return ended{}, err
	}
	logger = logger.WithValues("cache", rec.Cache.String(), "mode", rec.Mode, "commit", rec.Commit, "outcome", rec.Outcome)
	var res ended
	if rec.shouldCommit() {
		res, err = p.commit(ctx, logger, pv.Name, rec, cause.Subject)
	} else {
		res, err = p.discard(ctx, logger, pv.Name, rec, cause.Subject)
	}
	if err != nil || res.Result == "" {
		return res, err
	}
	res.Outcome = rec.Outcome
	p.metrics.ends.WithLabelValues(res.Result, cause.Trigger).Inc()
	p.reports.Add(rec.Cache)
	return res, nil
}

// readMarker reads the build's markers when the commit policy asks for
// them. The pods have ended, so nothing changes them any more.
func (p *Provisioner) readMarker(ctx context.Context, volume string, rec provisioned) (marker, error) {
	if rec.Commit != v1alpha1.CommitOnMarker || rec.Mode != v1alpha1.ModeWrite {
		return markerNone, nil
	}
	abort, err := p.store.HasControlFile(ctx, volume, v1alpha1.MarkerAbort)
	if err != nil || abort {
		return markerAbort, err
	}
	commit, err := p.store.HasControlFile(ctx, volume, v1alpha1.MarkerCommit)
	if err != nil || !commit {
		return markerNone, err
	}
	return markerCommit, nil
}

func (p *Provisioner) commit(ctx context.Context, logger logr.Logger, volume string, rec provisioned, subject runtime.Object) (ended, error) {
	start := time.Now()
	// Announced before the commit's sync, which takes seconds for a large
	// delta, so that a build starting on another node now waits for it.
	changed, err := p.store.HasChanges(ctx, volume)
	announced := err == nil && changed
	if announced {
		p.sync.announce(ctx, rec.Cache, volume)
	}
	res, err := p.store.Commit(ctx, volume)
	if announced && (err == nil || errors.Is(err, layerfs.ErrNotFound)) {
		p.sync.committed(ctx, rec.Cache, volume, res.Layer != "")
	}
	if errors.Is(err, layerfs.ErrNotFound) {
		logger.Info("Volume already gone; nothing to commit")
		return ended{}, nil
	}
	if err != nil {
		reason := "error"
		if errors.Is(err, layerfs.ErrBusy) {
			reason = "busy"
		}
		p.metrics.fail(opCommit, reason)
		// The store keeps the upper layer on any failure; the caller
		// retries with backoff.
		msg := fmt.Sprintf("commit of volume %s into cache %s failed and is retried; the volume's changes are kept: %v", volume, rec.Cache, err)
		p.events.Eventf(subject, nil, corev1.EventTypeWarning, reasonCommitFailed, actionCommit, "%s", msg)
		return ended{}, fmt.Errorf("commit volume %s into cache %s: %w", volume, rec.Cache, err)
	}
	p.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	out := ended{Result: v1alpha1.ResultCommitted, Generation: res.Generation}
	switch {
	case res.Torn:
		out = ended{Result: v1alpha1.ResultDiscarded}
		p.events.Eventf(subject, nil, corev1.EventTypeWarning, reasonCommitTorn, actionCommit,
			"node %s went down while volume %s was mounted; its changes were written without syncs and may be torn, so they were discarded and cache %s stays at generation %d",
			p.node, volume, rec.Cache, res.Generation)
	case res.OverLimit:
		out = ended{Result: v1alpha1.ResultDiscarded}
		p.events.Eventf(subject, nil, corev1.EventTypeWarning, reasonCommitOverLimit, actionCommit,
			"volume %s's changes take %s, more than its claim's storage request, so they were discarded and cache %s stays at generation %d; request more storage in the claim",
			volume, v1alpha1.FormatSize(res.Bytes), rec.Cache, res.Generation)
	case res.Dropped:
		out = ended{Result: v1alpha1.ResultDropped}
		p.events.Eventf(subject, nil, corev1.EventTypeNormal, reasonCommitDropped, actionCommit,
			"cache %s was deleted while volume %s used it, so the volume's changes were dropped", rec.Cache, volume)
	case res.Layer == "":
		p.events.Eventf(subject, nil, corev1.EventTypeNormal, reasonCommitted, actionCommit,
			"volume %s had no changes; cache %s stays at generation %d", volume, rec.Cache, res.Generation)
	default:
		p.events.Eventf(subject, nil, corev1.EventTypeNormal, reasonCommitted, actionCommit,
			"committed volume %s as generation %d of cache %s (%d bytes)", volume, res.Generation, rec.Cache, res.Bytes)
	}
	logger.Info("Committed", "generation", res.Generation, "layer", res.Layer, "bytes", res.Bytes, "dropped", res.Dropped, "torn", res.Torn, "overLimit", res.OverLimit)
	if res.NeedsSquash {
		p.squashes.Add(rec.Cache)
	}
	if res.Layer != "" {
		// A cache without a registry costs the publisher one read.
		p.sync.queuePublish(rec.Cache)
	}
	return out, nil
}

func (p *Provisioner) discard(ctx context.Context, logger logr.Logger, volume string, rec provisioned, subject runtime.Object) (ended, error) {
	err := p.store.Discard(ctx, volume)
	if errors.Is(err, layerfs.ErrNotFound) {
		logger.Info("Volume already gone; nothing to discard")
		return ended{}, nil
	}
	if err != nil {
		p.metrics.fail(opDiscard, "error")
		p.events.Eventf(subject, nil, corev1.EventTypeWarning, reasonDiscardFailed, actionDiscard, "discarding volume %s failed and is retried: %v", volume, err)
		return ended{}, fmt.Errorf("discard volume %s of cache %s: %w", volume, rec.Cache, err)
	}
	why := rec.discardWhy()
	p.events.Eventf(subject, nil, corev1.EventTypeNormal, reasonDiscarded, actionDiscard, "discarded volume %s: %s", volume, why)
	logger.Info("Discarded", "why", why)
	return ended{Result: v1alpha1.ResultDiscarded}, nil
}

// owningPod returns the pod that owns claim, or nil for a standalone claim.
func (p *Provisioner) owningPod(ctx context.Context, claim *corev1.PersistentVolumeClaim) (*corev1.Pod, error) {
	ref, ok := podfacts.OwningPod(claim)
	if !ok {
		return nil, nil
	}
	pod, err := p.getPod(ctx, claim.Namespace, ref.Name)
	if err == nil && pod.UID != ref.UID {
		err = apierrors.NewNotFound(corev1.Resource("pods"), ref.Name)
	}
	if err != nil {
		// Retried; a pod that is gone takes its claim with it.
		return nil, fmt.Errorf("get pod %s/%s, which owns claim %s, to evaluate the cache template: %w", claim.Namespace, ref.Name, claim.Name, err)
	}
	return pod, nil
}
