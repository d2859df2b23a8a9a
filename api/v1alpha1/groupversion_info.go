// Package v1alpha1 holds the layercache.dev/v1alpha1 API: the Cache and
// CacheReplica resources and the names (annotations, finalizer,
// provisioner) that the node agent, the manager and users share.
//
// +kubebuilder:object:generate=true
// +groupName=layercache.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The scheme builder is apimachinery's, as in Kubernetes' own API packages,
// not controller-runtime's: the layerfs CLI uses this package and must not
// link controller-runtime.
var (
	// GroupVersion is the API group and version of the Cache resource.
	GroupVersion = schema.GroupVersion{Group: "layercache.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &Cache{}, &CacheList{}, &CacheReplica{}, &CacheReplicaList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
