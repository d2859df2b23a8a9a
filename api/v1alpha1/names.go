package v1alpha1

// Names shared by the node agent, the manager and users (design.md, "Names").
// They are part of the public interface: keep them stable.
const (
	// ProvisionerName is the provisioner of layercache StorageClasses.
	ProvisionerName = "layercache.dev/node"

	// StorageClassName is the StorageClass of the default install.
	StorageClassName = "layercache"

	// AnnotationCache on a PVC names its cache: NAME (same namespace) or
	// NAMESPACE/NAME. On a PV it always holds NAMESPACE/NAME.
	AnnotationCache = "layercache.dev/cache"

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

	// AnnotationPodOutcome on a PV is written by the manager before it
	// releases the PVC: OutcomeSucceeded or OutcomeFailed. A PV released
	// without it has an unknown outcome.
	AnnotationPodOutcome = "layercache.dev/pod-outcome"

	// FinalizerCleanup on a Cache is added by the manager and removed once no
	// existing Node holds the cache any more.
	FinalizerCleanup = "layercache.dev/cleanup"
)

// Values of the annotations above.
const (
	ModeWrite = "write"
	ModeRead  = "read"

	CommitOnSuccess = "on-success"
	CommitAlways    = "always"
	CommitNever     = "never"

	ReleaseOnPodExit = "on-pod-exit"

	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
)
