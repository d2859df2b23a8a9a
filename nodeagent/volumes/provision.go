package volumes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/registrysync"
	"github.com/layercache/layercache/podfacts"
)

// PodGetter reads a pod from the API server. Provision needs the pod that
// owns a claim before the scheduler binds it to this node, so the agent's
// informer of this node's pods does not have it yet.
type PodGetter func(ctx context.Context, namespace, name string) (*corev1.Pod, error)

// RegistrySync is the registry sync (package registrysync) as the
// provisioner, the build ends and the maintenance call it: pull and seed
// before a mount, announce and committed around a commit, publish after
// it, and the cleanup of a deleted Cache's registry copy.
type RegistrySync interface {
	Pull(ctx context.Context, subject registrysync.Subject, req kit.VolumeRequest)
	Seed(ctx context.Context, subject registrysync.Subject, req kit.VolumeRequest) ([]layerfs.CacheRef, map[layerfs.CacheRef]string)
	Announce(ctx context.Context, ref layerfs.CacheRef, volume string)
	Committed(ctx context.Context, ref layerfs.CacheRef, volume string, layer bool)
	QueuePublish(ref layerfs.CacheRef)
	Owes(info layerfs.CacheInfo, pub *v1alpha1.PublishedChain) bool
	Status(ref layerfs.CacheRef, info layerfs.CacheInfo) kit.SyncStatus
	Unpublish(ctx context.Context, cache *v1alpha1.Cache) error
}

var _ RegistrySync = (*registrysync.Syncer)(nil)

// Provisioner provisions and deletes the layercache volumes of one node.
type Provisioner struct {
	node     string
	hostname string
	store    kit.Store
	// gateRoot is the store's root, whose mount gate (gate.go) the PVs
	// go through; "" (tests) points them at the mount points.
	gateRoot string
	caches   *kit.Caches
	events   events.EventRecorder
	metrics  *kit.Metrics
	getPod   PodGetter
	// seen has the outcomes of pods that ended and went away before their
	// volumes ended.
	seen *outcomes
	// reports and squashes run off the critical path.
	reports  *kit.CacheQueue
	squashes *kit.CacheQueue
	// sync keeps caches whose class names a registry in step across
	// nodes.
	sync RegistrySync
	// holds holds a build pod before its volume is handed out and
	// releases it once the volume ended.
	holds *podHolds
	// classes are the StorageClasses CSI volumes may name.
	classes storagelisters.StorageClassLister
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
	node, ok := claim.Annotations[kit.AnnSelectedNode]
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
		var refused *kit.ClaimError
		if errors.As(err, &refused) {
			p.events.Eventf(claim, nil, corev1.EventTypeWarning, refused.Reason, kit.ActionProvision, "%s", refused.Message)
			p.metrics.Fail(kit.OpProvision, refused.Reason)
		} else {
			p.metrics.Fail(kit.OpProvision, "api")
		}
		logger.Info("Claim refused", "reason", err.Error())
		// Finished: nothing runs in the background. The library retries with
		// backoff, which picks up a fixed claim, class or grant.
		return nil, controller.ProvisioningFinished, err
	}
	if req.ForcedRead {
		p.events.Eventf(claim, nil, corev1.EventTypeNormal, kit.ReasonModeForcedRead, kit.ActionProvision,
			"StorageClass %q makes every volume read-only, so the volume of cache %s is a read view that is never committed, although the claim asks for %s: %s",
			opts.StorageClass.Name, req.Cache, v1alpha1.AnnotationMode, v1alpha1.ModeWrite)
	}

	if owner, ok := podfacts.OwningPod(claim); ok {
		if err := p.holds.hold(ctx, claim.Namespace, owner.Name, owner.UID); err != nil {
			p.metrics.Fail(kit.OpProvision, "api")
			return nil, controller.ProvisioningFinished, fmt.Errorf("hold pod %s/%s until its build's end: %w", claim.Namespace, owner.Name, err)
		}
	}
	if req.Registry != nil {
		p.sync.Pull(ctx, claim, req)
		req.Fallbacks, req.FallbackRepositories = p.sync.Seed(ctx, claim, req)
	}
	vol, err := p.store.Mount(ctx, opts.PVName, req.MountOptions())
	if err != nil {
		p.metrics.Fail(kit.OpProvision, kit.ReasonMountFailed)
		return nil, controller.ProvisioningFinished, fmt.Errorf("mount volume %s of cache %s on node %s: %w", opts.PVName, req.Cache, p.node, err)
	}
	path := vol.MergedPath
	if p.gateRoot != "" {
		if err := openGate(p.gateRoot, opts.PVName, vol.MergedPath); err != nil {
			p.metrics.Fail(kit.OpProvision, kit.ReasonMountFailed)
			return nil, controller.ProvisioningFinished, err
		}
		path = gatePath(p.gateRoot, opts.PVName)
	}
	pv := buildPV(pvSpec{
		Name: opts.PVName, Node: p.node, Hostname: p.hostname, Path: path,
		Request: req, Volume: vol, Claim: claim, Class: opts.StorageClass,
	})
	p.metrics.ProvisionSeconds.WithLabelValues(string(req.Mode)).Observe(time.Since(start).Seconds())
	p.metrics.Provisioned(req.Cache, vol)
	p.reports.Add(req.Cache)
	if vol.SeededFrom != nil {
		then := "a commit creates it on the fallback's layers"
		if req.Mode == v1alpha1.ModeRead {
			then = "the volume is a read view and creates nothing"
		}
		p.events.Eventf(claim, nil, corev1.EventTypeNormal, kit.ReasonSeeded, kit.ActionProvision,
			"volume %s of cache %s starts from fallback %s at generation %d: cache %s has no generation %s yet; %s, and the fallback is never written",
			opts.PVName, req.Cache, vol.SeededFrom.Cache, vol.SeededFrom.Generation, req.Cache, noGenerationWhere(req, p.node), then)
	}
	logger.Info("Provisioned", "cache", req.Cache.String(), "mode", req.Mode, "commit", req.Commit,
		"baseGeneration", vol.BaseGeneration, "seededFrom", seededFrom(vol), "path", vol.MergedPath)
	return pv, controller.ProvisioningFinished, nil
}

// admit decides whether the claim may have a volume, and which.
func (p *Provisioner) admit(ctx context.Context, claim *corev1.PersistentVolumeClaim, opts controller.ProvisionOptions) (kit.VolumeRequest, error) {
	class, err := kit.ParseClass(opts.StorageClass)
	if err != nil {
		return kit.VolumeRequest{}, err
	}
	// kit.ParseClass refuses immediate binding, so a claim gets here with no
	// selected node only if the class changed under it.
	if opts.SelectedNodeName == "" {
		return kit.VolumeRequest{}, &kit.ClaimError{Reason: kit.ReasonInvalidStorageClass,
			Message: fmt.Sprintf("claim has no selected node although StorageClass %q binds on first consumer; recreate the claim", opts.StorageClass.Name)}
	}
	var pod *corev1.Pod
	if class.NeedsPod(claim) {
		if pod, err = p.owningPod(ctx, claim); err != nil {
			return kit.VolumeRequest{}, err
		}
	}
	return p.admitVolume(ctx, kit.ClaimSettings(claim, pod), class)
}

// Delete ends a released volume (see end) and lets the library delete its
// PV. A volume already ended at its pod's end is gone from the store, so
// this only cleans up; Delete is safe to call again after a failure or a
// restart.
func (p *Provisioner) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	if !p.ShouldDelete(ctx, pv) {
		return &controller.IgnoredError{Reason: fmt.Sprintf("PV %s belongs to node %q, this is node %s", pv.Name, pv.Annotations[v1alpha1.AnnotationNode], p.node)}
	}
	if _, err := p.end(ctx, pv, endCause{Outcome: p.seen.get(claimKey(pv)), Trigger: triggerRelease, Subject: pv}); err != nil {
		return err
	}
	if p.gateRoot == "" {
		return nil
	}
	return closeGate(p.gateRoot, pv.Name)
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

// noGenerationWhere says where a seeded volume's cache has no generation:
// on this node for a node-local class, anywhere for a registry class
// (fallbacks count only while no node has published one).
func noGenerationWhere(req kit.VolumeRequest, node string) string {
	if req.Registry != nil {
		return "on any node (nothing published)"
	}
	return "on node " + node
}

// admitVolume validates a volume's settings and checks that its
// namespace may use the caches they name: the one admission of claims and
// CSI volumes. It creates the Cache of the volume's own namespace on first
// use.
func (p *Provisioner) admitVolume(ctx context.Context, s kit.Settings, class kit.ClassParams) (kit.VolumeRequest, error) {
	req, err := kit.ParseSettings(s, class)
	if err != nil {
		return req, err
	}
	if err := p.caches.Authorize(ctx, s.Namespace, req); err != nil {
		return req, err
	}
	req.Fallbacks, err = p.caches.AuthorizeFallbacks(ctx, s.Namespace, req.Fallbacks, s.FallbackSource)
	return req, err
}
