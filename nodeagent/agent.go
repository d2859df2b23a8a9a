package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
	libmetrics "sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller/metrics"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/registrysync"
	"github.com/layercache/layercache/nodeagent/volumes"
	"github.com/layercache/layercache/remote"
)

// Component is the event source and field manager of the node agent.
const Component = kit.Component

// Run serves as the node agent until ctx ends: it recovers the store,
// remounts the volumes of PVs bound on this node, then provisions and
// deletes this node's volumes, reports cache status and keeps the store
// within its bounds.
func Run(ctx context.Context, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	logger := log.FromContext(ctx).WithValues("node", opts.NodeName)
	ctx = log.IntoContext(ctx, logger)

	cfg, err := bootstrap.RESTConfig(opts.Kubeconfig, Component)
	if err != nil {
		return err
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create Kubernetes client: %w", err)
	}
	scheme, err := bootstrap.Scheme()
	if err != nil {
		return err
	}
	hooks := &storeHooks{log: logger}
	st, err := layerfs.Open(ctx, layerfs.Options{Root: opts.Root, MaxLayers: opts.MaxLayers, Progress: progressLogger(logger),
		SnapshotImageBytes: opts.SnapshotImageBytes, MkfsBtrfs: opts.MkfsBtrfs,
		Log: logger.WithName("store"), OnLazyReadFailed: hooks.lazyReadFailed, OnLazyComplete: hooks.lazyComplete,
		LazyfsSidecar: opts.LazyfsSidecar})
	if err != nil {
		return fmt.Errorf("open layer store: %w", err)
	}
	// Layers mounted before their bytes were here are served by this
	// process, or through the lazyfs sidecar; after it, they read errors
	// (or, with the sidecar, wait) until the next agent resumes them
	// (ResumeLazy).
	defer func() {
		if err := st.Close(); err != nil {
			logger.Error(err, "Close the layer store")
		}
	}()

	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                 scheme,
		Logger:                 logger,
		Metrics:                metricsserver.Options{BindAddress: opts.MetricsBindAddress},
		HealthProbeBindAddress: opts.HealthProbeBindAddress,
		Cache:                  informerOptions(opts.NodeName),
		// Every node agent serves its own node; there is nothing to elect.
		LeaderElection: false,
	})
	if err != nil {
		return fmt.Errorf("create controller manager: %w", err)
	}
	m, err := kit.NewMetrics(crmetrics.Registry)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	if err := crmetrics.Registry.Register(kit.NewLazyCollector(st.LazyStats)); err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}

	recorder := kit.BoundedRecorder{EventRecorder: mgr.GetEventRecorder(Component)}
	// The provision controller's informers, shared: chains are checked
	// against the classes without a request per pull.
	claimInformers := newClaimInformers(clientset, opts.NodeName, controller.DefaultResyncPeriod)
	hostname := nodeHostname(ctx, clientset, opts.NodeName)
	a, err := newAgent(opts, agentParts{
		store: st, caches: &kit.Caches{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Node: opts.NodeName},
		events: recorder, metrics: m,
		hostname: hostname,
		getPod: func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
			return clientset.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		},
		secrets: func(ctx context.Context, name string) (*corev1.Secret, error) {
			return clientset.CoreV1().Secrets(opts.Namespace).Get(ctx, name, metav1.GetOptions{})
		},
		kube: clientset, claimInformers: claimInformers,
	})
	if err != nil {
		return err
	}
	hooks.bind(a.caches, recorder, a.queues.reports)
	if err := a.wire(ctx, clientset, crmetrics.Registry); err != nil {
		return err
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("provisioner", a.readyCheck); err != nil {
		return err
	}
	err = builder.ControllerManagedBy(mgr).
		For(&v1alpha1.Cache{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetDeletionTimestamp() != nil
		}))).
		Named("node-cache-cleanup").
		// A registry that does not answer is retried with backoff, not
		// controller-runtime's default of a few milliseconds first.
		WithOptions(crcontroller.Options{RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](2*time.Second, 5*time.Minute)}).
		Complete(a.core.Maintainer())
	if err != nil {
		return fmt.Errorf("create Cache cleanup controller: %w", err)
	}
	if err := mgr.Add(manager.RunnableFunc(func(runCtx context.Context) error {
		return a.run(log.IntoContext(runCtx, logger))
	})); err != nil {
		return err
	}
	logger.Info("Starting node agent", "root", st.Root(), "hostname", hostname)
	logger.Info("Volume size limits (a claim's storage request) are enforced at commit: a build's larger changes are discarded. " +
		"The store uses no filesystem project quotas, so a runaway build is not stopped while it runs; --gc-min-free-percent keeps caches from filling the node")
	return mgr.Start(ctx)
}

// informerOptions scopes the controller-runtime informers to what the
// agent reads: its own node's CacheReplicas, never the cluster's, so that
// its memory does not grow with the number of nodes. No cached object
// keeps its managed fields.
func informerOptions(node string) crcache.Options {
	return crcache.Options{
		DefaultTransform: crcache.TransformStripManagedFields(),
		ByObject: map[client.Object]crcache.ByObject{
			&v1alpha1.CacheReplica{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelReplicaNode: v1alpha1.ReplicaNodeLabel(node)})},
		},
	}
}

// agent ties the volumes core, the registry sync, their informers and
// queues together.
type agent struct {
	opts   Options
	store  kit.Store
	caches *kit.Caches
	core   *volumes.Core
	sync   *registrysync.Syncer
	// queues is the work off the critical path; the agent runs it, the
	// parts feed it.
	queues workQueues

	claimInformers, pvInformers, podInformers informers.SharedInformerFactory
	pvs                                       corelisters.PersistentVolumeLister
	controller                                *controller.ProvisionController

	ready atomic.Bool
}

// agentParts are what an agent is made over: its store, the API as it
// reads and writes it, and what it reports through.
type agentParts struct {
	store   kit.Store
	caches  *kit.Caches
	events  events.EventRecorder
	metrics *kit.Metrics
	// hostname is the node's kubernetes.io/hostname, which PVs' node
	// affinity names (nodeHostname).
	hostname string
	getPod   volumes.PodGetter
	// secrets are the registry sync's (registrysync.Config).
	secrets registrysync.SecretGetter
	kube    kubernetes.Interface
	// claimInformers are the cluster's claims and classes (newClaimInformers).
	claimInformers informers.SharedInformerFactory
}

func newAgent(opts Options, p agentParts) (*agent, error) {
	a := &agent{opts: opts, store: p.store, caches: p.caches, queues: newWorkQueues(), claimInformers: p.claimInformers}
	a.watchNode(p.kube)
	a.sync = registrysync.New(registrysync.Config{
		Node: opts.NodeName, Store: p.store, Caches: p.caches, Events: p.events, Metrics: p.metrics,
		Classes: p.claimInformers.Storage().V1().StorageClasses().Lister(), Secrets: p.secrets,
		TmpDir: filepath.Join(opts.Root, "tmp"), Compression: remote.Compression(opts.RegistryCompression),
		Reports: a.queues.reports, Squashes: a.queues.squashes, Publishes: a.queues.publishes,
	})
	var err error
	a.core, err = volumes.New(volumes.Config{
		Node: opts.NodeName, Hostname: p.hostname, Root: opts.Root,
		Store: p.store, Caches: p.caches, Events: p.events, Metrics: p.metrics, GetPod: p.getPod, Sync: a.sync,
		Reports: a.queues.reports, Squashes: a.queues.squashes, Publishes: a.queues.publishes,
		GC:         layerfs.GCOptions{MaxAge: opts.GCMaxAge, MaxBytes: opts.GCMaxBytes, MinFreeBytes: opts.GCMinFreeBytes, MinFreePercent: opts.GCMinFreePercent},
		KubeletDir: opts.KubeletDir, CSILimits: kit.CSILimits{Default: opts.CSIDefaultBytes, Max: opts.CSIMaxBytes},
		ResyncInterval: opts.ResyncInterval,
		Kube:           p.kube, Pods: a.podInformers.Core().V1().Pods().Informer(), PVs: a.pvInformers.Core().V1().PersistentVolumes().Informer(),
		Claims:  p.claimInformers.Core().V1().PersistentVolumeClaims().Lister(),
		Classes: p.claimInformers.Storage().V1().StorageClasses().Lister(),
	})
	return a, err
}

// watchNode makes the informers of this node's PVs (by label) and pods
// (by field), which keeps the agent's memory independent of the
// cluster's size; no cached object keeps its managed fields, which are
// often its largest part.
func (a *agent) watchNode(kube kubernetes.Interface) {
	resync := controller.DefaultResyncPeriod
	strip := informers.WithTransform(crcache.TransformStripManagedFields())
	a.pvInformers = informers.NewSharedInformerFactoryWithOptions(kube, resync, strip,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{volumes.LabelNode: a.opts.NodeName}.String()
		}))
	a.podInformers = informers.NewSharedInformerFactoryWithOptions(kube, resync, strip,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.opts.NodeName).String()
		}))
	a.pvs = a.pvInformers.Core().V1().PersistentVolumes().Lister()
}

// wire builds the provision controller on the informers the agent
// shares with the core.
func (a *agent) wire(ctx context.Context, kube kubernetes.Interface, reg prometheus.Registerer) error {
	pvInformer := a.pvInformers.Core().V1().PersistentVolumes()
	claimInformer := a.claimInformers.Core().V1().PersistentVolumeClaims()
	lib := libmetrics.New("controller")
	for _, c := range []prometheus.Collector{
		lib.PersistentVolumeClaimProvisionTotal, lib.PersistentVolumeClaimProvisionFailedTotal,
		lib.PersistentVolumeClaimProvisionDurationSeconds, lib.PersistentVolumeDeleteTotal,
		lib.PersistentVolumeDeleteFailedTotal, lib.PersistentVolumeDeleteDurationSeconds,
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register provisioner library metrics: %w", err)
		}
	}
	a.controller = controller.NewProvisionController(ctx, kube, v1alpha1.ProvisionerName, a.core.Provisioner(),
		controller.LeaderElection(false),
		controller.ClaimsInformer(claimInformer.Informer()),
		controller.ClassesInformer(a.claimInformers.Storage().V1().StorageClasses().Informer()),
		controller.VolumesInformer(pvInformer.Informer()),
		// A PV deleted by hand still gets its volume committed or discarded.
		controller.AddFinalizer(true),
		// A commit is retried until it lands: giving up would strand the
		// volume's changes.
		controller.FailedDeleteThreshold(0),
		// The library's default backoff grows to 1000s, so a claim refused
		// for a missing grant, or a commit that failed once, would wait up
		// to 17 minutes after the grant or the fix. Nothing tells the
		// library that a Cache changed, so keep the retries frequent.
		controller.RateLimiter(workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](2*time.Second, 2*time.Minute),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
		)),
		controller.MetricsInstance(lib),
	)
	return nil
}

// run recovers, remounts, then serves; it returns when ctx ends.
func (a *agent) run(ctx context.Context) error {
	if err := a.core.Recover(ctx); err != nil {
		return err
	}
	factories := []informers.SharedInformerFactory{a.claimInformers, a.pvInformers, a.podInformers}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	for _, f := range factories {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("sync %v informer: %w", typ, context.Cause(ctx))
			}
		}
	}
	pvs, err := a.pvs.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list this node's PVs: %w", err)
	}
	// Before the remount: a volume over a partial layer needs it served.
	a.resumeLazy(ctx)
	a.core.Remount(ctx, pvs)

	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	a.queues.run(ctx, a.core.Maintainer(), a.sync)
	go a.periodic(ctx)
	a.core.Serve(ctx, stop)
	// On shutdown, let the operations in flight return before the process
	// exits (the store would recover them, but finishing is cheaper).
	var workers sync.WaitGroup
	a.controller.ControllerWaitGroup(&workers)
	a.ready.Store(true)
	a.controller.Run(ctx)
	workers.Wait()
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// periodic runs the maintenance pass now and then every ResyncInterval.
func (a *agent) periodic(ctx context.Context) {
	t := time.NewTicker(a.opts.ResyncInterval)
	defer t.Stop()
	for {
		a.core.Maintainer().Pass(ctx)
		a.resumeLazy(ctx) // those the registry could not serve before
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resumeLazy serves the layers that an agent before this one mounted
// before their bytes were here, each checked against its Cache's chain as
// it stands now; one that cannot be served yet is tried again at the next
// maintenance pass.
func (a *agent) resumeLazy(ctx context.Context) {
	if err := a.store.ResumeLazy(ctx, a.sync.ReopenLazy); err != nil {
		log.FromContext(ctx).Error(err, "Serve again the layers fetched on demand; volumes over those not served are refused until they are")
	}
}

func (a *agent) readyCheck(*http.Request) error {
	if !a.ready.Load() {
		return errors.New("recovering the layer store and remounting volumes")
	}
	return nil
}

// nodeHostname returns the node's kubernetes.io/hostname label, which PV
// node affinity matches; it usually equals the node name, which is the
// fallback when the node cannot be read.
func nodeHostname(ctx context.Context, clientset kubernetes.Interface, node string) string {
	n, err := clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		log.FromContext(ctx).Info("Cannot read this node's hostname label; PV node affinity uses the node name", "err", err.Error())
		return node
	}
	if h := n.Labels[volumes.HostnameLabel]; h != "" {
		return h
	}
	return node
}

// progressLogger logs long store operations at most every few seconds per
// operation and cache, and always when one finishes.
func progressLogger(logger logr.Logger) func(layerfs.Progress) {
	var mu sync.Mutex
	last := map[string]time.Time{}
	return func(p layerfs.Progress) {
		key := p.Op + " " + p.Cache
		done := p.Total > 0 && p.Done >= p.Total
		mu.Lock()
		due := done || time.Since(last[key]) >= 5*time.Second
		if due {
			last[key] = time.Now()
		}
		if done {
			delete(last, key)
		}
		mu.Unlock()
		if due {
			logger.Info("Progress", "op", p.Op, "cache", p.Cache, "done", p.Done, "total", p.Total)
		}
	}
}
