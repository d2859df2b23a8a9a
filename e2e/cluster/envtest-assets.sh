#!/usr/bin/env bash
# Prepare the binaries of the envtest suite (make test-envtest): the pinned
# kube-apiserver that build-kubernetes.sh builds (stamp-cached, so a no-op
# when current) and Debian's etcd (installed once, its service not
# started). Links both into _output/envtest, the directory that
# KUBEBUILDER_ASSETS names, and prints that directory. Starts nothing: the
# tests run their own etcd and kube-apiserver on free loopback ports.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! command -v etcd >/dev/null; then
	require_root
	install_etcd
fi
"$CLUSTER_LIB/build-kubernetes.sh"

dir=$OUT_DIR/envtest
mkdir -p "$dir"
ln -sfn "$BIN_DIR/kube-apiserver" "$dir/kube-apiserver"
ln -sfn "$(command -v etcd)" "$dir/etcd"
echo "$dir"
