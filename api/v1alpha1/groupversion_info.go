// Package v1alpha1 holds the layercache.dev/v1alpha1 API: the Cache resource
// and the names (annotations, finalizer, provisioner) that the node agent,
// the manager and users share.
//
// +kubebuilder:object:generate=true
// +groupName=layercache.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of the Cache resource.
	GroupVersion = schema.GroupVersion{Group: "layercache.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
