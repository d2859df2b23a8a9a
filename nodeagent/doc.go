// Package nodeagent is `layercache node`, the agent of one node (a
// DaemonSet, no leader election). Its files show its parts; what they
// share (requests and their parsers, the Cache client, queues, Events and
// metrics) is the package kit below them:
//
//   - provisioning (provision.go, kit's claim.go and cachename.go, pv.go): the
//     external provisioner of the sig-storage library. It provisions the
//     layercache claims the scheduler placed on its node as hostPath PVs
//     backed by layerfs volumes (copy-on-write views of a named cache); a
//     Qualifier takes only claims whose selected node is this node, and a
//     DeletionGuard only PVs stamped with this node's name. cachename.go
//     names a claim's cache (its annotation, else its class's template);
//   - build ends: a pod-owned claim's build ends when the pods of its node
//     that use it have ended (podwatch.go watches them), any other claim's
//     when its PV is released (Delete); either way buildend.go commits or
//     discards the volume by its mode, its commit policy, the outcome and
//     the build's markers. podhold.go holds such pods with a finalizer
//     until their volumes have ended, so a pod deleted as it ends keeps
//     its outcome while the agent is away;
//   - registry sync (the package registrysync, which the parts hold as the
//     interface registrySync): for classes that name a registry, it pulls
//     the layers its node lacks before a mount, pushes committed layers and
//     appends them to the Cache's status.published, the cluster-wide chain,
//     which it checks against the classes the agent serves before a byte
//     moves;
//   - maintenance (maintain.go, kit's caches.go and queue.go): status reports on
//     the Cache resources, squashes, retention, GC and the cleanup of
//     deleted caches, off the critical path;
//   - Events (kit's events.go): every reason and action the parts' Events use;
//   - the process (agent.go, options.go, kit's metrics.go): the agent makes
//     and runs the work queues (workqueues.go) and hands each part those it
//     feeds.
package nodeagent
