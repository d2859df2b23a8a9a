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

# run_example_twice MANIFEST: the cache demo. The example Job's pod names
# the cache "demo", lists what it finds there and adds a line. Its changes
# are committed after the pod ends, so the second run waits for the cache's
# generation to advance before it starts: it then finds the first run's line.
run_example_twice() {
	local manifest=$1 ns=layercache-demo job i
	job=$("$KUBECTL" create --dry-run=client -o jsonpath='{.metadata.name}' -f "$manifest")
	"$KUBECTL" delete namespace "$ns" --ignore-not-found --wait --timeout=120s >/dev/null
	k create namespace "$ns"
	for i in 1 2; do
		echo
		echo "== build $i"
		"$KUBECTL" -n "$ns" delete job "$job" --ignore-not-found --wait >/dev/null
		k -n "$ns" apply -f "$manifest"
		k -n "$ns" wait --for=condition=complete "job/$job" --timeout=180s
		k -n "$ns" logs "job/$job"
		wait_for_generation "$ns" demo "$i"
		k -n "$ns" get caches
		k -n "$ns" get cachereplicas
	done
	echo
	echo "The second build started with the first build's cache: its log lists build 1."
}

# wait_for_generation NS CACHE GEN waits (bounded) until the Cache reports
# generation GEN, i.e. the finished build's changes are committed.
wait_for_generation() {
	local ns=$1 cache=$2 want=$3 got="" try
	for try in $(seq 1 90); do
		got=$("$KUBECTL" -n "$ns" get cache "$cache" -o jsonpath='{.status.generation}' 2>/dev/null || true)
		[[ ${got:-0} -ge $want ]] && return 0
		sleep 2
	done
	die "cache $ns/$cache is at generation ${got:-none} after 3 minutes, want $want: see kubectl -n layercache-system logs ds/layercache-node"
}

show_cluster
example=$REPO_DIR/e2e/examples/build-job.yaml
[[ -f $example ]] || die "missing $example"
"$KUBECTL" get crd caches.layercache.dev >/dev/null 2>&1 || die "layercache is not deployed (config/e2e): run make up"
run_example_twice "$example"
echo
echo "export KUBECONFIG=$KUBECONFIG_FILE"
