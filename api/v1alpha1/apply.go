package v1alpha1

import (
	"k8s.io/apimachinery/pkg/types"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
)

// CacheReplicaApplyConfiguration is a server-side apply body for a
// CacheReplica. A node agent states the whole replica of its node, so
// the body is the object itself.
//
// +kubebuilder:object:generate=false
type CacheReplicaApplyConfiguration struct {
	metav1ac.TypeMetaApplyConfiguration    `json:",inline"`
	*metav1ac.ObjectMetaApplyConfiguration `json:"metadata,omitempty"`
	Spec                                   *CacheReplicaSpec   `json:"spec,omitempty"`
	Status                                 *CacheReplicaStatus `json:"status,omitempty"`
}

// CacheReplicaApply is the apply body of node's replica of Cache
// namespace/name (whose UID is uid, for the owner reference that makes the
// garbage collector delete the replica with its Cache), stating status.
func CacheReplicaApply(namespace, name string, uid types.UID, node string, status CacheReplicaStatus) *CacheReplicaApplyConfiguration {
	owner := metav1ac.OwnerReference().WithAPIVersion(GroupVersion.String()).WithKind("Cache").
		WithName(name).WithUID(uid)
	meta := metav1ac.ObjectMeta().WithNamespace(namespace).WithName(CacheReplicaName(name, node)).
		WithLabels(map[string]string{LabelReplicaCache: name, LabelReplicaNode: ReplicaNodeLabel(node)}).
		WithOwnerReferences(owner)
	b := &CacheReplicaApplyConfiguration{ObjectMetaApplyConfiguration: meta,
		Spec: &CacheReplicaSpec{Cache: name, Node: node}, Status: &status}
	b.WithKind("CacheReplica").WithAPIVersion(GroupVersion.String())
	return b
}

// IsApplyConfiguration marks the type as an apply configuration.
func (b *CacheReplicaApplyConfiguration) IsApplyConfiguration() {}
