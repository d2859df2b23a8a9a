#!/usr/bin/env bash
# Run the e2e suite against the cluster that up.sh started.
#   run-e2e.sh [--multinode] [go test arguments, e.g. -run TestClusterIsReal -v] [./e2e/PACKAGE/...]
# Packages given (arguments starting with ./) replace the default ./e2e/...
# --multinode runs e2e/multinode (build tags e2e,multinode) instead, which
# needs a cluster of two nodes with the registry (make up NODES=2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# go test runs two packages at a time (-p, the cores), taking them in the
# order given: the longest, e2e/argo and e2e/cache, start side by side,
# and e2e/tekton follows e2e/argo while the short packages follow
# e2e/cache. Alphabetically e2e/tekton came last, after both, and was the
# long pole. Packages listed twice run once.
tags=e2e packages=(./e2e/argo/ ./e2e/cache/ ./e2e/tekton/ ./e2e/...)
if [[ ${1:-} == --multinode ]]; then
	tags=e2e,multinode packages=(./e2e/multinode/)
	shift
fi
for arg; do
	[[ $arg != ./* ]] || packages=()
done
[[ -f $KUBECONFIG_FILE ]] || die "no cluster: $KUBECONFIG_FILE is missing; run make up first"
export KUBECONFIG=$KUBECONFIG_FILE
cd "$REPO_DIR"
log "running e2e tests ${packages[*]:-(as given)} (KUBECONFIG=$KUBECONFIG)"
# The scenarios mostly wait on the cluster, so more run at once than cores.
go test -tags "$tags" -count=1 -parallel 8 -timeout 40m "$@" "${packages[@]}"
