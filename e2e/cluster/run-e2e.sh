#!/usr/bin/env bash
# Run the e2e suite against the cluster that up.sh started.
#   run-e2e.sh [go test arguments, e.g. -run TestClusterIsReal -v]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ -f $KUBECONFIG_FILE ]] || die "no cluster: $KUBECONFIG_FILE is missing; run make up first"
export KUBECONFIG=$KUBECONFIG_FILE
cd "$REPO_DIR"
log "running e2e tests (KUBECONFIG=$KUBECONFIG)"
# The scenarios mostly wait on the cluster, so more run at once than cores.
go test -tags e2e -count=1 -parallel 8 -timeout 40m "$@" ./e2e/...
