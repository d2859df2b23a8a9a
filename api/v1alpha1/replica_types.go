package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// CacheReplicaSpec names the cache and the node of a replica. Both are
// fixed for the replica's life: its name derives from them.
type CacheReplicaSpec struct {
	// Cache is the name of the Cache, in the replica's namespace.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="cache is immutable"
	Cache string `json:"cache"`

	// Node is the name of the Node that holds the copy.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable"
	Node string `json:"node"`
}

// CacheReplicaStatus is a cache's state on one node.
type CacheReplicaStatus struct {
	// Generation counts the commits on this node; 0 is the empty cache.
	Generation int64 `json:"generation"`

	// Layers is the number of layers in the cache's head on this node.
	Layers int32 `json:"layers"`

	// SizeBytes is the size of the cache's layers on this node.
	SizeBytes int64 `json:"sizeBytes"`

	// LastUsed is when a volume of the cache was last mounted or committed
	// on this node.
	// +optional
	LastUsed *metav1.Time `json:"lastUsed,omitempty"`

	// LastWriter names who produced the current generation on this node:
	// the pod (NAMESPACE/NAME) that owned the claim, or the standalone
	// claim (NAMESPACE/NAME).
	// +optional
	LastWriter string `json:"lastWriter,omitempty"`

	// Unpublished counts the layers committed on this node that are not
	// in the registry yet (it was unreachable, a layer cannot be
	// published, or the push is under way); they are pushed oldest first,
	// and PublishError says what holds them back.
	// +optional
	Unpublished int32 `json:"unpublished,omitempty"`

	// Filling counts the layers this node mounted before their bytes were
	// here (the class's mountFirst) whose local copies are still being
	// completed from the registry; builds read them meanwhile, fetching
	// on demand what they need.
	// +optional
	Filling int32 `json:"filling,omitempty"`

	// SeededFrom is the fallback cache whose layers this node's copy of
	// the cache was created on (annotation layercache.dev/fallback); its
	// bottom layers are shared with that cache, not copied.
	// +optional
	SeededFrom *CacheSeed `json:"seededFrom,omitempty"`

	// PublishError is why this node's last attempt to publish the cache
	// failed: the registry's answer, a layer that cannot be published
	// (its path and why), or a published chain the node does not trust.
	// Empty once a publish succeeds.
	// +optional
	PublishError string `json:"publishError,omitempty"`
}

// CacheReplica is a Cache's copy on one node, as that node's agent
// reports it. There is one per cache and node, in the cache's namespace,
// named CacheReplicaName(cache, node) and owned by the Cache; the manager
// sums them up in the Cache's status. A Cache used from thousands of nodes
// so stays small (etcd refuses objects over 1.5 MiB), and each node agent
// writes and watches only its own replicas.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=layercache
// +kubebuilder:printcolumn:name="Cache",type=string,JSONPath=`.spec.cache`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Generation",type=integer,JSONPath=`.status.generation`
// +kubebuilder:printcolumn:name="Layers",type=integer,JSONPath=`.status.layers`
// +kubebuilder:printcolumn:name="Bytes",type=integer,JSONPath=`.status.sizeBytes`
// +kubebuilder:printcolumn:name="Unpublished",type=integer,JSONPath=`.status.unpublished`
// +kubebuilder:printcolumn:name="Filling",type=integer,JSONPath=`.status.filling`
// +kubebuilder:printcolumn:name="Last Used",type=date,JSONPath=`.status.lastUsed`
type CacheReplica struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec CacheReplicaSpec `json:"spec"`
	// +optional
	Status CacheReplicaStatus `json:"status,omitempty"`
}

// CacheReplicaList is a list of CacheReplicas.
//
// +kubebuilder:object:root=true
type CacheReplicaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CacheReplica `json:"items"`
}

// Labels of a CacheReplica, for selecting a cache's or a node's replicas.
const (
	// LabelReplicaCache is the name of the replica's Cache.
	LabelReplicaCache = "layercache.dev/cache"
	// LabelReplicaNode is ReplicaNodeLabel of the replica's node.
	LabelReplicaNode = "layercache.dev/node"
)

// CacheReplicaName is the name of the replica of cache on node:
// CACHE.NODE, or CACHE.HASH where that is too long for a name (node names
// may have 253 characters).
func CacheReplicaName(cache, node string) string {
	if name := cache + "." + node; len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	return cache + "." + shortHash(node)
}

// ReplicaNodeLabel is the value of LabelReplicaNode for node: its name,
// or a hash of it where the name is too long for a label value.
func ReplicaNodeLabel(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	return shortHash(node)
}

// shortHash is 16 hex digits of name's SHA-256: unique enough among a
// cluster's nodes, and short enough for names and label values.
func shortHash(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "h" + hex.EncodeToString(sum[:8])
}
