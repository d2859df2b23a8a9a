//go:build tools

// Package tools pins controller-gen at the controller-tools release that
// matches the project's controller-runtime (v0.23, Kubernetes 1.35). `make
// generate` builds it from here.
package tools

import _ "sigs.k8s.io/controller-tools/cmd/controller-gen"
