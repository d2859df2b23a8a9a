package v1alpha1

// Names shared by the node agent, the manager and users (docs/reference.md, "Claim annotations").
// They are part of the public interface: keep them stable.
const (
	// ProvisionerName is the provisioner of layercache StorageClasses.
	ProvisionerName = "layercache.dev/node"

	// CSIDriverName is the CSI driver of layercache inline volumes: a
	// pod's spec.volumes[].csi.driver.
	CSIDriverName = "layercache.dev"

	// LabelCSI on a Namespace, set to CSIEnabled by a cluster admin, lets
	// the namespace's pods use CSI inline volumes of CSIDriverName. Any
	// pod may name a CSI driver (Pod Security's restricted profile allows
	// it), and an inline volume passes neither ResourceQuota nor the
	// StorageClass an admin chose for claims: so it is opt-in.
	LabelCSI   = "layercache.dev/csi"
	CSIEnabled = "enabled"

	// CSIAttributeCache and CSIAttributeMode are the volumeAttributes of a
	// CSI inline volume that name its cache and mode, as AnnotationCache
	// and AnnotationMode do on a claim.
	CSIAttributeCache = "cache"
	CSIAttributeMode  = "mode"

	// CSIAttributeStorageClass names a StorageClass of ProvisionerName
	// whose parameters apply to a CSI inline volume as to a claim of that
	// class (registry, layout, templates, uid/gid/mode); without it a
	// volume is of a class without parameters, a node-local cache.
	CSIAttributeStorageClass = "storageClass"

	// StorageClassName is the StorageClass of the default install.
	StorageClassName = "layercache"

	// SnapshotStorageClassName is the default install's class of the
	// snapshot layout (docs/using.md, "Volume layouts").
	SnapshotStorageClassName = "layercache-snapshot"

	// AnnotationCache on a PVC names its cache: NAME (same namespace) or
	// NAMESPACE/NAME. On a PV it always holds NAMESPACE/NAME.
	AnnotationCache = "layercache.dev/cache"

	// AnnotationFallback on a PVC lists caches to start from while its
	// cache has no generation: comma-separated, tried in order, at most
	// MaxFallbacks, each NAME (same namespace) or NAMESPACE/NAME (needs
	// that Cache's spec.readers to list the claim's namespace). The
	// volume's commit creates the cache on the fallback's layers, shared.
	AnnotationFallback = "layercache.dev/fallback"

	// AnnotationSeededFrom on a PV is the fallback its volume started from,
	// NAMESPACE/NAME@GENERATION; absent when it started from its own cache
	// or empty.
	AnnotationSeededFrom = "layercache.dev/seeded-from"

	// AnnotationMode on a PVC or PV is ModeWrite or ModeRead.
	AnnotationMode = "layercache.dev/mode"

	// AnnotationCommit on a PVC or PV is the commit policy: CommitOnSuccess,
	// CommitAlways or CommitNever.
	AnnotationCommit = "layercache.dev/commit"

	// AnnotationRelease on a standalone PVC set to ReleaseOnPodExit makes the
	// manager delete the PVC when its pods have ended.
	AnnotationRelease = "layercache.dev/release"

	// AnnotationBaseGeneration on a PV is the cache generation its volume was
	// mounted on.
	AnnotationBaseGeneration = "layercache.dev/base-generation"

	// AnnotationNode on a PV is the identity of the node agent that made it.
	AnnotationNode = "layercache.dev/node"

	// AnnotationPodOutcome on a PV is the outcome of the pods that used
	// the volume, OutcomeSucceeded or OutcomeFailed: written by the node
	// agent when it ends a pod-owned volume at its pod's end, and by the
	// manager before it releases a standalone claim. A PV whose volume ends
	// without it had an unknown outcome.
	AnnotationPodOutcome = "layercache.dev/pod-outcome"

	// AnnotationResult on a PV is what became of its volume once its build
	// ended: ResultCommitted, ResultDiscarded or ResultDropped. The node
	// agent writes it with AnnotationCommittedGeneration.
	AnnotationResult = "layercache.dev/result"

	// AnnotationCommittedGeneration on a PV is the cache generation that
	// holds the volume's changes, when AnnotationResult is ResultCommitted.
	AnnotationCommittedGeneration = "layercache.dev/committed-generation"

	// MarkerCommit and MarkerAbort are files in the volume's control
	// directory, .layercache at its root (layerfs.ControlDir, which the
	// store owns and strips at commit). Under CommitOnMarker the volume is
	// committed only if the build wrote MarkerCommit and not MarkerAbort.
	MarkerCommit = "commit"
	MarkerAbort  = "abort"

	// FinalizerOutcome on a standalone PVC is added by the manager and
	// removed once every pod that used the claim has ended and their
	// outcome is on the PV: an owner that deletes the claim and lifts
	// kubernetes.io/pvc-protection itself while a pod still holds it (Tekton
	// does, at a PipelineRun's completion) cannot end the volume before its
	// outcome is known.
	FinalizerOutcome = "layercache.dev/outcome"

	// LabelStorageClass on a Cache names the StorageClass of the claim
	// whose node agent created it; the manager reads that class's
	// ParamClusterMaxAge. Absent on Caches that users created.
	LabelStorageClass = "layercache.dev/storage-class"

	// ParamClusterMaxAge is the StorageClass parameter that gives the
	// Caches it creates a cluster-wide max age (ParseClusterMaxAge) when
	// their spec.retention.clusterMaxAge is unset.
	ParamClusterMaxAge = "clusterMaxAge"

	// AnnotationMaxCacheSize on a Namespace bounds the total size of its
	// caches, each counted by its largest node copy, as a quantity such
	// as "10Gi"; past it the manager deletes the least recently used.
	AnnotationMaxCacheSize = "layercache.dev/max-cache-size"

	// FinalizerCleanup on a Cache is added by the manager and removed once no
	// existing Node holds the cache any more.
	FinalizerCleanup = "layercache.dev/cleanup"

	// FinalizerRegistry on a Cache with a published chain is added by the
	// node agents and removed once one of them has deleted the cache's
	// manifest from its registry (or the registry refused, or did not
	// answer for an hour), so that the registry's garbage collection
	// frees the cache's blobs.
	FinalizerRegistry = "layercache.dev/registry"

	// FinalizerBuildEnd on a build pod is added by the node agent of the
	// pod's node once the pod runs there with a layercache volume that
	// the pod's outcome decides (a claim it owns, or a CSI inline
	// volume), and removed once those volumes have ended. A pod deleted
	// as soon as it ends, while the agent is away, so stays readable:
	// the API server deletes a terminal pod at once, and its phase is the
	// build's outcome.
	FinalizerBuildEnd = "layercache.dev/build-end"
)

// MaxFallbacks is how many caches AnnotationFallback may list.
const MaxFallbacks = 5

// Values of the annotations above; those of AnnotationMode and
// AnnotationCommit are the types Mode and CommitPolicy (values.go).
const (
	ReleaseOnPodExit = "on-pod-exit"

	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"

	ResultCommitted = "committed"
	ResultDiscarded = "discarded"
	// ResultDropped: the cache was deleted while the volume used it, so
	// its changes went with it.
	ResultDropped = "dropped"
)
