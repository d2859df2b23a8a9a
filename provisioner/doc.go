// Package provisioner is `layercache node`: the external provisioner of one
// node. It provisions the layercache claims the scheduler placed on its
// node as hostPath PVs backed by layerfs volumes (copy-on-write views of a
// named cache), commits or discards them when they are released, and
// reports each cache's state on this node in the Cache resource's status.
//
// One agent runs per node (a DaemonSet) without leader election: a
// Qualifier takes only claims whose selected node is this node, and a
// DeletionGuard only PVs stamped with this node's name.
package provisioner
