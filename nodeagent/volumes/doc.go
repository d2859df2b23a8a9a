// Package volumes is the node agent's core: it owns a volume's life on
// one node, admit, mount and end, for each of its doors, and the upkeep
// of the node's caches. New makes it from a Config with every part
// given, the agent's informers included, to which it connects its doors;
// the agent (package nodeagent) runs them (Recover, Remount, Serve).
//
//   - the PV provisioner (provision.go, pv.go, gate.go): the sig-storage
//     library's Provisioner. It provisions the layercache claims the
//     scheduler placed on its node as hostPath PVs backed by layerfs
//     volumes; a Qualifier takes only claims whose selected node is this
//     node, and a DeletionGuard only PVs stamped with this node's name.
//     admitVolume admits a claim and a CSI volume alike. A PV's path goes
//     through the mount gate (gate.go);
//   - the pod watch: a pod-owned claim's build ends when the pods of its
//     node that use it have ended (podwatch.go), any other claim's when
//     its PV is released (Provisioner.Delete); either way endVolume
//     (buildend.go) commits or discards the volume by its mode, its commit
//     policy, the outcome and the build's markers. podhold.go holds such
//     pods with a finalizer until their volumes have ended, so a pod
//     deleted as it ends keeps its outcome while the agent is away;
//   - the CSI node service (csi.go, csiend.go, csiserve.go): the same
//     admission and end as a claim's, without a claim or a PV;
//   - the Maintainer (maintain.go): status reports on the Cache
//     resources, squashes, retention, GC and the cleanup of deleted
//     caches, off the critical path.
//
// The core reaches the registry sync through the interface RegistrySync
// (package registrysync implements it) and stands on the package kit.
package volumes
