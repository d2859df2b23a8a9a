package provisioner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
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
	List(ctx context.Context) ([]layerfs.CacheInfo, error)
	Inspect(ctx context.Context, cache layerfs.CacheRef) (layerfs.CacheInfo, error)
	Recover(ctx context.Context) (layerfs.RecoverResult, error)
}

// Provisioner provisions and deletes the layercache volumes of one node.
type Provisioner struct {
	node     string
	hostname string
	store    store
	caches   *caches
	events   record.EventRecorder
	metrics  *metrics
	// reports and squashes run off the critical path; nil in tests that
	// don't look at them.
	reports  *cacheQueue
	squashes *cacheQueue
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
			p.events.Event(claim, corev1.EventTypeWarning, refused.Reason, refused.Message)
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
		p.events.Eventf(claim, corev1.EventTypeNormal, reasonModeForcedRead,
			"StorageClass %q makes every volume read-only, so the volume of cache %s is a read view that is never committed, although the claim asks for %s: %s",
			opts.StorageClass.Name, req.Cache, v1alpha1.AnnotationMode, v1alpha1.ModeWrite)
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
	p.metrics.provisionSeconds.WithLabelValues(req.Mode).Observe(time.Since(start).Seconds())
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
	req, err := parseClaim(claim, class)
	if err != nil {
		return req, err
	}
	return req, p.caches.authorize(ctx, claim.Namespace, req)
}

// Delete commits or discards a released volume, as its mode, its commit
// policy and its pod's outcome say. A volume that is already gone counts as
// done, so Delete is safe to call again after a failure or a restart.
func (p *Provisioner) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	if !p.ShouldDelete(ctx, pv) {
		return &controller.IgnoredError{Reason: fmt.Sprintf("PV %s belongs to node %q, this is node %s", pv.Name, pv.Annotations[v1alpha1.AnnotationNode], p.node)}
	}
	logger := log.FromContext(ctx).WithValues("pv", pv.Name)
	rec, err := parsePV(pv)
	if err != nil {
		p.events.Event(pv, corev1.EventTypeWarning, reasonInvalidVolume, err.Error())
		p.metrics.fail(opCommit, reasonInvalidVolume)
		return err
	}
	logger = logger.WithValues("cache", rec.Cache.String(), "mode", rec.Mode, "commit", rec.Commit, "outcome", rec.Outcome)
	if rec.shouldCommit() {
		err = p.commit(ctx, logger, pv, rec)
	} else {
		err = p.discard(ctx, logger, pv, rec)
	}
	if err != nil {
		return err
	}
	p.reports.Add(rec.Cache)
	return nil
}

func (p *Provisioner) commit(ctx context.Context, logger logr.Logger, pv *corev1.PersistentVolume, rec provisioned) error {
	start := time.Now()
	res, err := p.store.Commit(ctx, pv.Name)
	if errors.Is(err, layerfs.ErrNotFound) {
		logger.Info("Volume already gone; nothing to commit")
		return nil
	}
	if err != nil {
		reason := "error"
		if errors.Is(err, layerfs.ErrBusy) {
			reason = "busy"
		}
		p.metrics.fail(opCommit, reason)
		// The store keeps the upper layer on any failure; returning the
		// error makes the library retry the commit with backoff.
		msg := fmt.Sprintf("commit of volume %s into cache %s failed and is retried; the volume's changes are kept: %v", pv.Name, rec.Cache, err)
		p.events.Event(pv, corev1.EventTypeWarning, reasonCommitFailed, msg)
		return fmt.Errorf("commit volume %s into cache %s: %w", pv.Name, rec.Cache, err)
	}
	p.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	switch {
	case res.Dropped:
		p.events.Eventf(pv, corev1.EventTypeNormal, reasonCommitDropped,
			"cache %s was deleted while volume %s used it, so the volume's changes were dropped", rec.Cache, pv.Name)
	case res.Layer == "":
		p.events.Eventf(pv, corev1.EventTypeNormal, reasonCommitted,
			"volume %s had no changes; cache %s stays at generation %d", pv.Name, rec.Cache, res.Generation)
	default:
		p.events.Eventf(pv, corev1.EventTypeNormal, reasonCommitted,
			"committed volume %s as generation %d of cache %s (%d bytes)", pv.Name, res.Generation, rec.Cache, res.Bytes)
	}
	logger.Info("Committed", "generation", res.Generation, "layer", res.Layer, "bytes", res.Bytes, "dropped", res.Dropped)
	if res.NeedsSquash {
		p.squashes.Add(rec.Cache)
	}
	return nil
}

func (p *Provisioner) discard(ctx context.Context, logger logr.Logger, pv *corev1.PersistentVolume, rec provisioned) error {
	err := p.store.Discard(ctx, pv.Name)
	if errors.Is(err, layerfs.ErrNotFound) {
		logger.Info("Volume already gone; nothing to discard")
		return nil
	}
	if err != nil {
		p.metrics.fail(opDiscard, "error")
		p.events.Eventf(pv, corev1.EventTypeWarning, reasonDiscardFailed, "discarding volume %s failed and is retried: %v", pv.Name, err)
		return fmt.Errorf("discard volume %s of cache %s: %w", pv.Name, rec.Cache, err)
	}
	p.events.Eventf(pv, corev1.EventTypeNormal, reasonDiscarded, "discarded volume %s: %s", pv.Name, discardWhy(rec))
	logger.Info("Discarded", "why", discardWhy(rec))
	return nil
}

// discardWhy explains to a user why a volume's changes were not kept.
func discardWhy(rec provisioned) string {
	switch {
	case rec.Mode == v1alpha1.ModeRead:
		return "it was a read-only view of cache " + rec.Cache.String()
	case rec.Commit == v1alpha1.CommitNever:
		return "its commit policy is never"
	case rec.Outcome == v1alpha1.OutcomeFailed:
		return "its pod failed and the commit policy is " + rec.Commit
	default:
		return "its pod's outcome is unknown and the commit policy is " + rec.Commit + " (only always commits without a recorded outcome)"
	}
}
