package nodeagent

// The node agent's permissions, which `make generate` turns into
// config/rbac/node/role.yaml (ClusterRole layercache-node, and Role
// layercache-node in the agents' namespace). Each says why.

// Watch claims; update one to hand it back to the scheduler (reschedule).
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;update

// Make, update and delete the node's PVs.
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;create;update;patch;delete

// Read the classes' parameters.
// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch

// Watch this node's pods (field selector spec.nodeName) to end a pod's
// volumes when it ends; get the pod that owns a claim for the StorageClass
// cache template. Patch a build pod of this node only to add and remove
// finalizer layercache.dev/build-end, which keeps it readable until its
// volumes have ended; the ValidatingAdmissionPolicy in
// config/rbac/node.yaml refuses any other change.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// Read namespaces' labels: CSI inline volumes are opt-in per namespace
// (label layercache.dev/csi).
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// The agent checks its own Node at start.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get

// Create a Cache on first use; append to the published chain (status
// only: the spec is its owner's).
// Patch a Cache only to add and lift finalizer layercache.dev/registry,
// which holds a deleted Cache until its registry copy is deleted.
// +kubebuilder:rbac:groups=layercache.dev,resources=caches,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=layercache.dev,resources=caches/status,verbs=patch

// State the node's own CacheReplicas (server-side apply, which creates
// them) and delete them when the cache leaves the node; read another
// node's replica to see whether its publishing fails.
// +kubebuilder:rbac:groups=layercache.dev,resources=cachereplicas,verbs=get;list;watch;create;patch;delete

// Events: the agent's own (events.k8s.io) and the provisioner library's
// (core).
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch;update

// Registry credentials: a StorageClass's registrySecret names a Secret in
// the agents' own namespace, so the agents get Secrets there only, never
// list or watch them.
// +kubebuilder:rbac:groups="",namespace=layercache-system,resources=secrets,verbs=get
