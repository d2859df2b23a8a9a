//go:build tools

// Package tools pins kpt, which `make deploy` and `make undeploy` use. The
// checksum database does not know kpt v1.0.0-beta.50, so `go install
// kpt@version` fails; this module's go.sum (written once with
// GONOSUMDB=github.com/GoogleContainerTools/kpt) verifies it instead, and the
// Makefile builds it here with `go build`.
package tools

import _ "github.com/GoogleContainerTools/kpt"
