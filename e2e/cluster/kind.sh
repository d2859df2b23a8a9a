#!/usr/bin/env bash
# The kind backend (needs a Docker engine):
#   kind.sh up NODES    create the cluster, load the image archives
#   kind.sh down        delete it
# up.sh builds the images first; CI uses the local backend instead.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v docker >/dev/null && docker info >/dev/null 2>&1 ||
	die "the kind backend needs a running Docker engine; on machines without one use: make up (CLUSTER=local)"
tool=$OUT_DIR/bin/kindcluster
(cd "$REPO_DIR" && go build -o "$tool" ./e2e/kind/cmd/kindcluster)

case ${1:-} in
up)
	mkdir -p "$CLUSTER_DIR"
	args=()
	for archive in $(image_archives); do args+=(--image-archive "$archive"); done
	"$tool" up --nodes "${2:-1}" --kubeconfig "$KUBECONFIG_FILE" ${KIND_NODE_IMAGE:+--node-image "$KIND_NODE_IMAGE"} "${args[@]}"
	;;
down)
	"$tool" down --kubeconfig "$KUBECONFIG_FILE"
	;;
*) die "usage: kind.sh up NODES | kind.sh down" ;;
esac
