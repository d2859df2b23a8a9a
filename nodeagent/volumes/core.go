package volumes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// buildEndWorkers bounds the volumes ended at once. Builds that end
// together then commit side by side; the store's locks keep each cache's
// commits in order, and concurrent commits share their syncfs and seal
// outside the cache's lock, so that 16 at once cost little more than one.
// With 4, the last of 50 builds that ended together waited for a dozen
// turns of the others' ends (p99 end to commit 16.6 s).
const buildEndWorkers = 16

// Config is what the volumes core of a node is made of. Every field is
// required but KubeletDir.
type Config struct {
	Node string
	// Hostname is the node's kubernetes.io/hostname label, which PVs'
	// node affinity names.
	Hostname string
	// Root is the store's root, whose mount gate (gate.go) the PVs go
	// through.
	Root    string
	Store   kit.Store
	Caches  *kit.Caches
	Events  events.EventRecorder
	Metrics *kit.Metrics
	// GetPod reads a claim's owning pod from the API server.
	GetPod PodGetter
	// Sync is the registry sync (package registrysync).
	Sync RegistrySync
	// Reports, Squashes and Publishes are the agent's queues the core
	// feeds; the agent runs Reports and Squashes with the Maintainer's
	// Report and Squash.
	Reports, Squashes, Publishes *kit.CacheQueue
	// GC bounds the node's caches (Maintainer.Pass).
	GC layerfs.GCOptions
	// KubeletDir is the kubelet's directory, under which the core serves
	// CSI inline volumes; "" serves none.
	KubeletDir string
	CSILimits  kit.CSILimits
	// ResyncInterval is how often the CSI volumes are swept for pods that
	// ended unseen.
	ResyncInterval time.Duration
	// Kube is the API the doors write pods' holds through; Pods and PVs
	// are the agent's informers of this node's pods and PVs, and Claims
	// its lister of claims. New adds its index and handlers to them.
	Kube   kubernetes.Interface
	Pods   cache.SharedIndexInformer
	PVs    cache.SharedIndexInformer
	Claims corelisters.PersistentVolumeClaimLister
	// Classes are the agent's lister of StorageClasses, whose parameters
	// apply to the CSI volumes that name one.
	Classes storagelisters.StorageClassLister
}

// Core owns a volume's life on one node, admit, mount and end, for each
// of its doors: the PV provisioner (Provisioner), the pod watch (build
// ends and pod holds) and the CSI node service; and the upkeep of the
// node's caches (Maintainer).
type Core struct {
	cfg     Config
	prov    *Provisioner
	maint   *Maintainer
	ends    *buildEnds
	holds   *podHolds
	csi     *csiDriver
	csiEnds *csiEnds
}

// New makes the core of cfg.Node and connects its doors to the agent's
// informers: it indexes this node's pods by claim, and watches them and
// the PVs for build ends, pod holds and, with a kubelet directory, the
// ends of CSI volumes.
func New(cfg Config) (*Core, error) {
	if err := cfg.Pods.AddIndexers(cache.Indexers{indexClaim: podClaims}); err != nil {
		return nil, fmt.Errorf("index pods by claim: %w", err)
	}
	pods, pvs := cfg.Pods.GetIndexer(), corelisters.NewPersistentVolumeLister(cfg.PVs.GetIndexer())
	c := &Core{cfg: cfg, holds: newPodHolds(cfg.Store, cfg.Kube, pods, cfg.Claims, pvs)}
	c.prov = &Provisioner{
		node: cfg.Node, hostname: cfg.Hostname, store: cfg.Store, gateRoot: cfg.Root, caches: cfg.Caches, events: cfg.Events,
		metrics: cfg.Metrics, getPod: cfg.GetPod, reports: cfg.Reports, squashes: cfg.Squashes, seen: newOutcomes(), sync: cfg.Sync,
		holds: c.holds, classes: cfg.Classes,
	}
	c.maint = &Maintainer{
		node: cfg.Node, store: cfg.Store, caches: cfg.Caches, events: cfg.Events, metrics: cfg.Metrics, gc: cfg.GC,
		reports: cfg.Reports, publishes: cfg.Publishes, sync: cfg.Sync,
	}
	c.ends = &buildEnds{prov: c.prov, kube: cfg.Kube, pods: pods, claims: cfg.Claims, pvs: pvs, queue: kit.NewKeyQueue("build-end"), seen: c.prov.seen}
	if cfg.KubeletDir != "" {
		locks := newVolumeLocks()
		c.csiEnds = newCSIEnds(c.prov, locks, pods)
		c.csi = newCSIDriver(c.prov, c.csiEnds, locks, cfg.KubeletDir, cfg.CSILimits)
	}
	return c, c.watch()
}

// Provisioner is the door of claims, which the provision controller
// calls.
func (c *Core) Provisioner() *Provisioner { return c.prov }

// Maintainer keeps the node's caches: the work queues' reports and
// squashes, the periodic pass and the cleanup of deleted Caches.
func (c *Core) Maintainer() *Maintainer { return c.maint }

// watch adds the doors' handlers to the informers.
func (c *Core) watch() error {
	if _, err := c.cfg.Pods.AddEventHandler(c.ends.handlers()); err != nil {
		return fmt.Errorf("watch this node's pods: %w", err)
	}
	if _, err := c.cfg.Pods.AddEventHandler(c.holds.handlers()); err != nil {
		return fmt.Errorf("watch this node's pods to hold them: %w", err)
	}
	if _, err := c.cfg.PVs.AddEventHandler(c.holds.volumeHandlers()); err != nil {
		return fmt.Errorf("watch this node's PVs to release held pods: %w", err)
	}
	if c.csiEnds != nil {
		if _, err := c.cfg.Pods.AddEventHandler(c.csiEnds.handlers()); err != nil {
			return fmt.Errorf("watch this node's pods for CSI volumes: %w", err)
		}
	}
	_, err := c.cfg.PVs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pv, ok := obj.(*corev1.PersistentVolume); ok {
				c.prov.seen.forget(claimKey(pv))
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watch this node's PVs: %w", err)
	}
	return nil
}

// Recover mounts the gate and recovers the store, before the informers
// start.
func (c *Core) Recover(ctx context.Context) error {
	logger := log.FromContext(ctx)
	if err := mountGate(c.cfg.Root); err != nil {
		return err
	}
	res, err := c.cfg.Store.Recover(ctx)
	if err != nil && !res.Finished {
		return fmt.Errorf("recover layer store %s: %w", c.cfg.Root, err)
	}
	// A volume that cannot be repaired (a full disk), or a leftover that
	// cannot be deleted, must not keep the agent from serving every other
	// volume: a volume's own end retries it, GC the leftover.
	for _, f := range res.Failed {
		c.cfg.Metrics.Fail(kit.OpRecover, "error")
		logger.Error(f.Err, "Volume could not be recovered; it is retried when its build ends", "volume", f.Volume)
	}
	if res.Unswept != "" {
		c.cfg.Metrics.Fail(kit.OpRecover, "unswept")
		logger.Error(errors.New(res.Unswept), "Some unreferenced layers could not be deleted; GC retries them")
	}
	logger.Info("Recovered layer store", "remounted", len(res.Remounted),
		"removedTemp", res.RemovedTemp, "removedLayers", res.RemovedLayers, "torn", res.Torn, "failed", len(res.Failed))
	return nil
}

// Remount mounts again the volumes of this node's PVs that a reboot took
// away, once the informers have synced.
func (c *Core) Remount(ctx context.Context, pvs []*corev1.PersistentVolume) {
	n := remount(ctx, c.cfg.Store, c.cfg.Events, c.cfg.Metrics, c.cfg.Node, c.prov.gateRoot, pvs)
	log.FromContext(ctx).Info("Checked mounts of this node's PVs", "pvs", len(pvs), "remounted", n)
}

// Serve runs the doors' workers until ctx ends. An agent that cannot
// serve CSI volumes stops, loudly (its pod restarts), rather than leave
// their pods waiting for a driver: stop is called with the cause.
func (c *Core) Serve(ctx context.Context, stop context.CancelCauseFunc) {
	go c.ends.run(ctx, buildEndWorkers)
	go c.holds.run(ctx, buildEndWorkers)
	if c.csiEnds == nil {
		return
	}
	go c.csiEnds.run(ctx, buildEndWorkers, c.cfg.ResyncInterval)
	go func() {
		if err := serveCSI(ctx, c.csi, csiSocketsIn(c.cfg.KubeletDir)); err != nil {
			stop(fmt.Errorf("CSI inline volumes (--kubelet-dir %s): %w", c.cfg.KubeletDir, err))
		}
	}()
}
