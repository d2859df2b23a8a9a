//go:build tools

// Package tools pins kwok, which e2e/scale runs out of cluster to make
// simulated Nodes Ready and their Pods Running (make scale). Build it with
// the Makefile's $(BIN)/kwok rule.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
