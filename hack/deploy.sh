#!/usr/bin/env bash
# Deploy layercache with kpt live apply, as `make deploy` and the e2e
# harness (e2e/cluster/up.sh) do.
#
#   hack/deploy.sh [default|e2e]
#
# default applies the kpt package config/ as it stands; an overlay is
# rendered with kustomize and applied with the package's inventory
# (config/resourcegroup.yaml). Objects that exist without an inventory (an
# install made with kubectl apply -k) are adopted: --inventory-policy=adopt,
# what this kpt calls adopt-if-no-inventory (objects of another inventory
# are still refused). kpt reports objects it
# would not touch as "skipped" and still exits 0; this script fails then,
# and on any failed apply or reconcile, so an install never silently stays
# as it was.
#
# Environment: KPT (default bin/kpt), KUBECTL (default kubectl),
# KUBECONFIG, DEPLOY_TIMEOUT (default 5m).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

overlay=${1:-default}
kpt=${KPT:-bin/kpt}
kubectl=${KUBECTL:-kubectl}
timeout=${DEPLOY_TIMEOUT:-5m}

die() {
	echo "deploy: $*" >&2
	exit 1
}

[[ -x $kpt ]] || die "no kpt at $kpt: run make bin/kpt (built from hack/tools/kpt)"
[[ -n ${KUBECONFIG:-} && -f $KUBECONFIG ]] || die "no kubeconfig at '${KUBECONFIG:-}': set KUBECONFIG, or run make up for the local cluster"

args=(live apply --inventory-policy=adopt --reconcile-timeout="$timeout")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
case $overlay in
default)
	"$kpt" "${args[@]}" config 2>&1 | tee "$log"
	;;
*)
	[[ -f config/$overlay/kustomization.yaml ]] || die "no overlay config/$overlay (use default or e2e)"
	mkdir -p _output/deploy
	{ cat config/resourcegroup.yaml; echo ---; "$kubectl" kustomize "config/$overlay"; } >"_output/deploy/$overlay.yaml"
	"$kpt" "${args[@]}" - <"_output/deploy/$overlay.yaml" 2>&1 | tee "$log"
	;;
esac

# kpt's summary lines, e.g.
#   apply result: 14 attempted, 14 successful, 0 skipped, 0 failed
#   reconcile result: 14 attempted, 14 successful, 0 skipped, 0 failed, 0 timed out
summary=$(grep -E '^(apply|reconcile) result:' "$log") || die "kpt printed no apply result (output above)"
bad=$(grep -E '(^|[^0-9])[1-9][0-9]* (skipped|failed|timed out)' <<<"$summary") || true
[[ -z $bad ]] || die "kpt did not apply everything: $bad (objects above; a skipped object belongs to another inventory or was changed by hand)"
