// Package nodeagent is `layercache node`, the agent of one node (a
// DaemonSet, no leader election). agent.go makes every part with all it
// needs and runs it; the parts are:
//
//   - provisioning (provision.go, pv.go, gate.go, claiminformer.go): the
//     external provisioner of the sig-storage library. It provisions the
//     layercache claims the scheduler placed on its node as hostPath PVs
//     backed by layerfs volumes (copy-on-write views of a named cache); a
//     Qualifier takes only claims whose selected node is this node, and a
//     DeletionGuard only PVs stamped with this node's name. admitVolume
//     admits a claim and a CSI volume alike;
//   - build ends: a pod-owned claim's build ends when the pods of its node
//     that use it have ended (podwatch.go watches them), any other claim's
//     when its PV is released (Delete); either way buildend.go commits or
//     discards the volume by its mode, its commit policy, the outcome and
//     the build's markers. podhold.go holds such pods with a finalizer
//     until their volumes have ended, so a pod deleted as it ends keeps
//     its outcome while the agent is away;
//   - CSI inline volumes (csi.go, csiend.go, csiserve.go): the same
//     admission and end as a claim's, without a claim or a PV;
//   - maintenance (maintain.go): status reports on the Cache resources,
//     squashes, retention, GC and the cleanup of deleted caches, off the
//     critical path, from the work queues (workqueues.go) the agent makes
//     and runs.
//
// The registry sync is the package registrysync, which the parts hold as
// the interface registrySync; what every part shares (the store
// interface, volume requests and their parsers, the Cache client, queues,
// Events and metrics) is the package kit below them all.
package nodeagent
