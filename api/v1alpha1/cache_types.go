package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CacheSpec is what the owner of a cache decides about it.
type CacheSpec struct {
	// Readers are the namespaces whose PVCs may mount this cache read-only
	// (annotation layercache.dev/cache: NAMESPACE/NAME). Only the cache's own
	// namespace can write it.
	// +optional
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Readers []string `json:"readers,omitempty"`

	// Retention bounds how long and how large the cache is kept on each node,
	// and how long in the cluster.
	// +optional
	Retention *Retention `json:"retention,omitempty"`
}

// Retention bounds a cache on each node (node agents enforce MaxAge and
// MaxSize when they garbage-collect their store) and in the cluster (the
// manager enforces ClusterMaxAge).
type Retention struct {
	// MaxAge removes the cache from a node that has not used it for this long,
	// for example "168h".
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`

	// MaxSize removes the cache from a node once it is larger than
	// this, for example "20Gi".
	// +optional
	MaxSize *resource.Quantity `json:"maxSize,omitempty"`

	// ClusterMaxAge deletes the Cache, on every node, once no node has
	// used it for this long, for example "720h"; "0s" keeps it forever.
	// Unset, the StorageClass parameter clusterMaxAge of the class that
	// created the Cache decides, else the manager's --cache-max-age.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="clusterMaxAge must not be negative: use a duration such as 720h, or 0s to keep the cache forever"
	ClusterMaxAge *metav1.Duration `json:"clusterMaxAge,omitempty"`
}

// CacheStatus sums up the cache's copies on the nodes that hold it, its
// CacheReplicas (one per node, each written by that node's agent), and
// holds its published chain. The manager derives the summary fields from
// the replicas: per-node entries here would grow the Cache with every
// node that used it, past what etcd stores at a few thousand nodes.
type CacheStatus struct {
	// Generation is the newest generation on any node.
	// +optional
	Generation int64 `json:"generation,omitempty"`

	// Size is the total size over all nodes, human-readable (for example
	// "1.5Gi").
	// +optional
	Size string `json:"size,omitempty"`

	// NodeCount is the number of nodes that hold the cache: its
	// CacheReplicas (kubectl get cachereplicas -l layercache.dev/cache=NAME).
	// +optional
	NodeCount int32 `json:"nodeCount,omitempty"`

	// LastUsed is the latest LastUsed over all nodes, and stays when
	// every node has evicted the cache: it is when the cache was last used
	// anywhere, which cluster-wide retention reads.
	// +optional
	LastUsed *metav1.Time `json:"lastUsed,omitempty"`

	// SeededFrom is what the cache was created on, as
	// NAMESPACE/NAME@GENERATION of a fallback cache (see its replicas'
	// status.seededFrom); nodes seeded from different generations are
	// listed, comma-separated. Empty for a cache that started empty.
	// +optional
	SeededFrom string `json:"seededFrom,omitempty"`

	// Published is the cache's cluster-wide generation log, when its
	// StorageClass syncs it through a registry. Node agents append their
	// layers to it with an optimistic update (a resourceVersion
	// precondition): the Cache is the sequencer, the registry holds the
	// bytes.
	// +optional
	Published *PublishedChain `json:"published,omitempty"`
}

// PublishedChain is a cache's layer chain in its registry repository.
type PublishedChain struct {
	// Repository holds the layers as blobs of one image, for example
	// "registry.example:5000/ci-caches/team-a/maven".
	Repository string `json:"repository"`

	// Secret names the Secret, in the node agents' namespace, with the
	// credentials for Repository (from the StorageClass's registrySecret);
	// empty for a registry without authentication.
	// +optional
	Secret string `json:"secret,omitempty"`

	// Generation counts the layers ever appended; the newest layer has it.
	Generation int64 `json:"generation"`

	// Layers is the chain, newest first.
	// +optional
	// +listType=atomic
	Layers []PublishedLayer `json:"layers,omitempty"`

	// Announced lists commits that nodes are making and publishing. A
	// node records a commit here as the build ends, before it commits and
	// pushes, and the append of the commit's layer to Layers removes it in
	// the same update. A node that provisions a volume of the cache waits
	// for the announced commits of other nodes (within its class's
	// syncTimeout), so that the next build sees the last one's commit on
	// any node.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Announced []AnnouncedLayer `json:"announced,omitempty"`
}

// AnnouncedLayer is a commit on its way to the chain.
type AnnouncedLayer struct {
	// Node is the node that commits the layer and publishes it.
	Node string `json:"node"`

	// Volume is the volume whose build ended, on that node.
	Volume string `json:"volume"`

	// Generation is the generation the layer is expected to make: the
	// chain's generation plus the announcements before it. Two nodes
	// publishing at once may land in the other order.
	Generation int64 `json:"generation"`

	// Committed is when the build ended and the node began the commit.
	Committed metav1.Time `json:"committed"`
}

// Same tells whether b announces the same commit as a.
func (a AnnouncedLayer) Same(b AnnouncedLayer) bool {
	return a.Node == b.Node && a.Volume == b.Volume
}

// PublishedLayer is one layer of a cache's chain.
type PublishedLayer struct {
	// Digest is the layer's (compressed) blob digest in the repository.
	Digest string `json:"digest"`

	// DiffID is the digest of the layer's uncompressed tar.
	DiffID string `json:"diffID"`

	// MediaType is the blob's OCI media type, which says its compression.
	MediaType string `json:"mediaType"`

	// Size is the blob's size in bytes.
	Size int64 `json:"size"`

	// Generation is the cache's generation that this layer made.
	Generation int64 `json:"generation"`

	// Node is the node that committed the layer.
	// +optional
	Node string `json:"node,omitempty"`

	// Covers lists the digests of the layers this layer replaced (newest
	// first), when it is a squash of them.
	// +optional
	// +listType=atomic
	Covers []string `json:"covers,omitempty"`

	// Index is the digest of the layer's index blob in the repository,
	// which maps the blob's frames to the image's bytes and lets a node
	// read the layer by range (mount it before its bytes are there).
	// Set together with IndexSize, or neither (a layer read whole only).
	// +optional
	Index string `json:"index,omitempty"`

	// IndexSize is the index blob's size in bytes; set with Index.
	// +optional
	IndexSize int64 `json:"indexSize,omitempty"`
}

// CacheSeed names a fallback cache at one of its generations.
type CacheSeed struct {
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
}

// String is NAMESPACE/NAME@GENERATION, as the PV annotation
// layercache.dev/seeded-from says it.
func (s CacheSeed) String() string {
	return fmt.Sprintf("%s/%s@%d", s.Namespace, s.Name, s.Generation)
}

// Cache is a named build cache. PVCs of the layercache StorageClass name it
// with the layercache.dev/cache annotation; node agents create it on first
// use and report its per-node state. Deleting it clears it on every node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=layercache
// +kubebuilder:printcolumn:name="Generation",type=integer,JSONPath=`.status.generation`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodeCount`
// +kubebuilder:printcolumn:name="Last Used",type=date,JSONPath=`.status.lastUsed`
// +kubebuilder:printcolumn:name="Seeded From",type=string,JSONPath=`.status.seededFrom`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Cache struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec CacheSpec `json:"spec,omitempty"`
	// +optional
	Status CacheStatus `json:"status,omitempty"`
}

// CacheList is a list of Caches.
//
// +kubebuilder:object:root=true
type CacheList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Cache `json:"items"`
}
