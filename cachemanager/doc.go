// Package cachemanager holds the cluster-wide controllers of layercache, run by
// `layercache manager`:
//
//   - the release controller ends the life of a layercache PVC when the pods
//     that used it have ended: it records the pods' outcome on the bound PV
//     (the node agent commits or discards by it) and deletes a releasable
//     PVC, lifting the kubernetes.io/pvc-protection finalizer that a
//     completed pod object would otherwise hold on it;
//   - the cache controller keeps the derived fields of Cache status (newest
//     generation, total size, node count, last use) and the
//     layercache.dev/cleanup finalizer, which it lifts once no existing Node
//     still holds a deleted cache;
//   - the expiry controller deletes a Cache that no node has used for its
//     cluster-wide max age (expire.go), and the namespace size controller
//     the least recently used Caches of a namespace over its size bound
//     (nssize.go).
//
// Everything on the node (mounts, commits, the per-node CacheReplicas) is
// the node agent's; the manager only reads and writes API objects.
package cachemanager
