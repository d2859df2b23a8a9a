package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
)

// CacheApplyConfiguration is a typed server-side apply body for a Cache:
// only the fields set are stated, so a field manager owns exactly those.
// Node agents state their own entry of status.nodes with it.
//
// +kubebuilder:object:generate=false
type CacheApplyConfiguration struct {
	metav1ac.TypeMetaApplyConfiguration    `json:",inline"`
	*metav1ac.ObjectMetaApplyConfiguration `json:"metadata,omitempty"`
	Status                                 *CacheStatusApplyConfiguration `json:"status,omitempty"`
}

// CacheStatusApplyConfiguration states entries of status.nodes (a map
// keyed by node, so each field manager owns its own entries), and the
// summary fields as the applier sees them.
//
// +kubebuilder:object:generate=false
type CacheStatusApplyConfiguration struct {
	Nodes      []NodeCacheStatus `json:"nodes,omitempty"`
	Generation int64             `json:"generation,omitempty"`
	Size       string            `json:"size,omitempty"`
	NodeCount  int32             `json:"nodeCount,omitempty"`
	LastUsed   *metav1.Time      `json:"lastUsed,omitempty"`
	SeededFrom string            `json:"seededFrom,omitempty"`
}

// CacheApply starts an apply body for Cache namespace/name.
func CacheApply(namespace, name string) *CacheApplyConfiguration {
	b := &CacheApplyConfiguration{ObjectMetaApplyConfiguration: metav1ac.ObjectMeta().WithNamespace(namespace).WithName(name)}
	b.WithKind("Cache").WithAPIVersion(GroupVersion.String())
	return b
}

// WithNodeStatus states entry as this field manager's entry of
// status.nodes.
func (b *CacheApplyConfiguration) WithNodeStatus(entry NodeCacheStatus) *CacheApplyConfiguration {
	if b.Status == nil {
		b.Status = &CacheStatusApplyConfiguration{}
	}
	b.Status.Nodes = append(b.Status.Nodes, entry)
	return b
}

// WithSummary states the summary fields of s (CacheStatus.Summarized).
// A node agent states them with its entry: the Cache then needs no
// second write by the manager, which still corrects a summary computed
// from a stale view of the other nodes' entries.
func (b *CacheApplyConfiguration) WithSummary(s CacheStatus) *CacheApplyConfiguration {
	if b.Status == nil {
		b.Status = &CacheStatusApplyConfiguration{}
	}
	b.Status.Generation, b.Status.Size, b.Status.NodeCount = s.Generation, s.Size, s.NodeCount
	b.Status.LastUsed, b.Status.SeededFrom = s.LastUsed, s.SeededFrom
	return b
}

// IsApplyConfiguration marks the type as an apply configuration.
func (b *CacheApplyConfiguration) IsApplyConfiguration() {}
