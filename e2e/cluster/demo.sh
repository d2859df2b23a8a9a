#!/usr/bin/env bash
# The README's quick start, run after `make up`: show the cluster, then run
# the example build twice against one cache and show that the second pod
# starts with what the first one left.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ -f $KUBECONFIG_FILE ]] || die "no cluster: run make up first"
export KUBECONFIG=$KUBECONFIG_FILE
k() { echo "\$ kubectl $*" >&2; "$KUBECTL" "$@"; }

show_cluster() {
	k get nodes -o wide
	k get pods -A
	if "$KUBECTL" get crd caches.layercache.dev >/dev/null 2>&1; then
		k get storageclass
		k get caches -A
	fi
}

# run_example_twice MANIFEST: the cache demo. The example workload is a Job
# whose pod names a cache; each run must see the previous run's files.
run_example_twice() {
	local manifest=$1 ns=layercache-demo i
	k create namespace "$ns" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
	for i in 1 2; do
		"$KUBECTL" -n "$ns" delete -f "$manifest" --ignore-not-found --wait >/dev/null
		k -n "$ns" apply -f "$manifest"
		k -n "$ns" wait --for=condition=complete job --all --timeout=180s
		k -n "$ns" logs job/"$(basename "$manifest" .yaml)"
		k -n "$ns" get caches
	done
}

show_cluster
example=$REPO_DIR/examples/build-cache.yaml
if [[ -f $example ]] && "$KUBECTL" get crd caches.layercache.dev >/dev/null 2>&1; then
	run_example_twice "$example"
else
	echo
	echo "The cluster is running. The cache demo starts once layercache is deployed"
	echo "(config/e2e) and $example exists."
fi
echo
echo "export KUBECONFIG=$KUBECONFIG_FILE"
