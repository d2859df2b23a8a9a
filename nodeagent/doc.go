// Package nodeagent is `layercache node`, the agent of one node (a
// DaemonSet, no leader election). Its files show its parts:
//
//   - provisioning (provision.go, claim.go, template.go, pv.go): the
//     external provisioner of the sig-storage library. It provisions the
//     layercache claims the scheduler placed on its node as hostPath PVs
//     backed by layerfs volumes (copy-on-write views of a named cache); a
//     Qualifier takes only claims whose selected node is this node, and a
//     DeletionGuard only PVs stamped with this node's name;
//   - build ends (buildend.go): it watches its node's pods and commits or
//     discards a pod's volume when the pod ends;
//   - registry sync (registry.go, sync.go, trust.go): for classes that
//     name a registry, it pushes committed layers and pulls the ones its
//     node lacks, with the Cache's status.published as the cluster-wide
//     chain, which only the owner's writing claims place and which the
//     agent checks against the classes it serves before a byte moves;
//   - maintenance (maintain.go, caches.go, queue.go): status reports on
//     the Cache resources, squashes, retention, GC and the cleanup of
//     deleted caches, off the critical path;
//   - the process (agent.go, options.go, metrics.go).
package nodeagent
