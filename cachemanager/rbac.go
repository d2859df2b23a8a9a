package cachemanager

// The manager's permissions, which `make generate` turns into
// config/rbac/manager/role.yaml (ClusterRole layercache-manager, and Role
// layercache-manager in its namespace). Each says why.

// Watch pods to see when the pods of a claim have ended. Patch a pod only
// to lift finalizer layercache.dev/build-end when its Node is gone (the
// ValidatingAdmissionPolicy layercache-node-pods refuses anything else).
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// Delete a releasable claim; patch to lift kubernetes.io/pvc-protection
// and to add or lift the outcome finalizer.
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;delete;patch

// Record the pods' outcome on the volume.
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;patch

// Tell layercache claims from others by their class's provisioner.
// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch

// A namespace's layercache.dev/max-cache-size annotation.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// Metadata only: a deleted Node no longer holds a deleted Cache.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// The cleanup finalizer and the derived status fields; delete a Cache
// past its cluster-wide max age or over its namespace's size bound.
// +kubebuilder:rbac:groups=layercache.dev,resources=caches,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=layercache.dev,resources=caches/status,verbs=get;update;patch

// Sum up the replicas in their Cache's status; delete those of Nodes that
// no longer exist.
// +kubebuilder:rbac:groups=layercache.dev,resources=cachereplicas,verbs=get;list;watch;delete

// Events: the controllers' own (events.k8s.io) and leader election's
// (core).
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch;update

// Leader election, in the manager's own namespace only.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=layercache-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
