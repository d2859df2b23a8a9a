#!/usr/bin/env bash
# Run the e2e suite against the cluster that up.sh started.
#   run-e2e.sh [--multinode] [go test arguments, e.g. -run TestClusterIsReal -v] [./e2e/PACKAGE/...]
# Packages given (arguments starting with ./) replace the default: every
# package, e2e/multinode (build tags e2e,multinode) too when the cluster has
# two nodes and the registry (make e2e-up). --multinode runs e2e/multinode
# alone.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# go test runs four packages at a time (-p 4), taking them in the order
# given: the longest, e2e/argo, e2e/cache and e2e/multinode (8 to 9
# minutes each, mostly waiting on builds and quiet watches), and
# e2e/tekton (about 5) start side by side, then the short packages. At -p
# 3 e2e/tekton waited for them and the stage took 12.8 minutes. Packages
# listed twice run once. The scenarios mostly wait on the cluster, so
# more of them run at once (-parallel 8) than there are cores.
tags=e2e packages=(./e2e/argo/ ./e2e/cache/ ./e2e/tekton/ ./e2e/...)
[[ -f $KUBECONFIG_FILE ]] || die "no cluster: $KUBECONFIG_FILE is missing; run make up first"
if [[ ${1:-} == --multinode ]]; then
	tags=e2e,multinode packages=(./e2e/multinode/)
	shift
elif [[ $(jq '(.nodes | length) > 1 and .registry != null' "$CLUSTER_DIR/cluster.json") == true ]]; then
	tags=e2e,multinode packages=(./e2e/argo/ ./e2e/cache/ ./e2e/multinode/ ./e2e/tekton/ ./e2e/...)
else
	log "one node: e2e/multinode does not run (it needs make up NODES=2, as make e2e-up starts)"
fi
for arg; do
	[[ $arg != ./* ]] || packages=()
done
export KUBECONFIG=$KUBECONFIG_FILE
cd "$REPO_DIR"
cmd=(go test -tags "$tags" -count=1 -p 4 -parallel 8 -timeout 40m "$@" "${packages[@]}")
log "running ${cmd[*]} (KUBECONFIG=$KUBECONFIG; later flags win)"
"${cmd[@]}"
