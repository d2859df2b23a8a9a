//go:build scale

// Package scale measures layercache's control plane against thousands of
// simulated nodes (issue 18, "Scale of the control plane"): the size of a
// Cache used from every node, the manager's memory, reconcile rate and
// API writes, and the node agent's memory as the cluster grows.
//
// It runs its own control plane, not the shared e2e cluster: etcd and
// kube-apiserver from the envtest assets (e2e/cluster/envtest-assets.sh),
// the CRDs of config/crd, and kwok (hack/tools/kwok) out of cluster, which
// makes the fake Nodes Ready and their Pods Running. The test plays every
// node's agent through the API (PVs shaped like the agent's, each node's
// CacheReplica applied with the agent's field manager) and runs the real
// `layercache manager` (and, as root, one real `layercache node`) as
// processes built from this tree.
//
// Run it with `make scale` (SCALE_NODES="1000 5000") or, short, with
// `make test-scale` (300 nodes, part of make test). e2e/README.md, "Scale",
// says what it measures and how.
package scale
