#!/usr/bin/env bash
# Install Tekton Pipelines into the local e2e cluster (make up WITH=tekton;
# make e2e asks for it).
#
#   e2e/cluster/tekton.sh [--build-only]
#
# --build-only builds the binaries and images and stops (make e2e-build).
#
# Builds the pinned release (e2e/tools/tekton: controller, webhook,
# entrypoint, nop, workingdirinit, sidecarlogresults) with `go build` into
# _output/bin/tekton, skipped when its inputs are unchanged; builds their
# images without Docker (hack/imagebuild); imports them into every node's
# containerd; writes the manifests from the module's own config/
# (e2e/tekton/cmd/tekton-manifests) to _output/tekton/tekton.yaml, applies
# them and waits until the webhook answers.
#
# The local cluster has no kube-proxy and no route from the host to the
# pod network, so the API server cannot reach a Service's ClusterIP or a
# pod's address. The controller and the webhook run on the host network
# (as layercache's own pods do), and the webhook's Service is an
# ExternalName of localhost: the API server resolves an ExternalName
# Service to that name, dials localhost at the webhook configuration's port
# and still verifies the certificate the webhook made for
# tekton-pipelines-webhook.tekton-pipelines.svc.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TOOLS=$REPO_DIR/e2e/tools/tekton
MODULE=github.com/tektoncd/pipeline
COMMANDS=(controller webhook entrypoint nop workingdirinit sidecarlogresults)
TEKTON_BIN=$BIN_DIR/tekton
TEKTON_OUT=$OUT_DIR/tekton
IMAGE_PREFIX=localhost/tekton-
NAMESPACE=tekton-pipelines

version=$(tools_version "$TOOLS" "$MODULE")

preflight() { require_local_cluster "Tekton" tekton; }

# build: the binaries and their images, skipped (even the link) when the
# tools module, the Go version and this script are unchanged. About 6
# minutes cold on 2 cores; the Go build cache keeps rebuilds short.
build() {
	local stamp_file=$TEKTON_BIN/.stamp stamp
	stamp=$(tools_stamp "$TOOLS" "${BASH_SOURCE[0]}")
	if tools_built "$stamp" "$TEKTON_BIN" "$TEKTON_OUT/images" "${COMMANDS[@]}"; then
		return
	fi
	log "building Tekton Pipelines $version (${COMMANDS[*]}); about 6 minutes the first time"
	local t=$SECONDS
	mkdir -p "$TEKTON_BIN" "$TEKTON_OUT/images"
	rm -f "$stamp_file"
	# Static binaries, as ko builds them upstream.
	(cd "$TOOLS" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
		go build -trimpath -ldflags "-s -w" -o "$TEKTON_BIN/" tool) ||
		die "building $MODULE in $TOOLS failed; see above"
	log "built Tekton binaries in $((SECONDS - t))s; building images"
	local tool=$TEKTON_BIN/buildimage
	(cd "$REPO_DIR" && go build -o "$tool" ./hack/imagebuild/cmd/buildimage)
	# Each image is its static binary where ko puts it (/ko-app/NAME, which
	# the controller names in the pods it makes: the entrypoint copies
	# itself from there), and /tmp, as ko's static base image has. No user
	# database: every pod that runs them gives a numeric user.
	for c in "${COMMANDS[@]}"; do
		"$tool" --output "$TEKTON_OUT/images/$c.tar" --ref "$IMAGE_PREFIX$c:$version" \
			--file "$TEKTON_BIN/$c:/ko-app/$c" --entrypoint "/ko-app/$c" \
			--env KO_DATA_PATH=/var/run/ko --tmpdir /tmp >/dev/null
	done
	echo "$stamp" >"$stamp_file"
}

# load_images imports the images into every node's containerd, as up.sh
# loads the project's; the pods' pull policy never reaches for a registry.
load_images() {
	local n c sock
	for ((n = 1; n <= NODE_COUNT; n++)); do
		sock=$(containerd_sock "$n")
		for c in "${COMMANDS[@]}"; do
			ctr --address "$sock" -n k8s.io images import "$TEKTON_OUT/images/$c.tar" >/dev/null ||
				die "importing $TEKTON_OUT/images/$c.tar into node $n failed"
		done
	done
	log "loaded ${IMAGE_PREFIX}{$(
		IFS=,
		echo "${COMMANDS[*]}"
	)}:$version into $NODE_COUNT node(s)"
}

manifests() {
	local config
	config=$(cd "$TOOLS" && go mod download -json "$MODULE@$version" | jq -r .Dir)/config
	[[ -d $config ]] || die "no config/ in the module cache for $MODULE@$version ($config)"
	(cd "$REPO_DIR" && go run ./e2e/tekton/cmd/tekton-manifests --config "$config" --version "$version" \
		--image-prefix "$IMAGE_PREFIX" --shell-image "$IMAGE_BUSYBOX" --pull-policy Never \
		--host-network --apiserver "127.0.0.1:$APISERVER_PORT") >"$TEKTON_OUT/tekton.yaml.new"
	mv "$TEKTON_OUT/tekton.yaml.new" "$TEKTON_OUT/tekton.yaml"
}

# webhook_ready: the API server reaches the webhook and it validates: a
# dry-run of an invalid Task is refused by Tekton, not by the API server.
webhook_ready() {
	local out
	out=$(kubectl create --dry-run=server -f - 2>&1 <<EOF
apiVersion: tekton.dev/v1
kind: Task
metadata:
  name: webhook-probe
  namespace: $NAMESPACE
spec:
  steps: []
EOF
	) && return 1
	[[ $out == *validation.webhook.pipeline.tekton.dev* && $out == *"missing field"* ]]
}

deploy() {
	log "applying Tekton Pipelines $version ($TEKTON_OUT/tekton.yaml)"
	kubectl apply --server-side --force-conflicts -f "$TEKTON_OUT/tekton.yaml" >/dev/null
	# Same tags, new content after a rebuild: restart on it.
	local digest stamp=$TEKTON_OUT/deployed-images
	digest=$(cat "$TEKTON_OUT"/images/{controller,webhook}.tar | sha256sum | cut -d' ' -f1)
	if [[ -f $stamp && $(<"$stamp") != "$digest" ]]; then
		kubectl -n "$NAMESPACE" rollout restart deployment >/dev/null
	fi
	echo "$digest" >"$stamp"
	if ! kubectl -n "$NAMESPACE" rollout status deployment --timeout=180s >/dev/null; then
		kubectl -n "$NAMESPACE" get pods -o wide >&2 || true
		kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp 2>&1 | tail -20 >&2 || true
		die "Tekton did not roll out in 180s (pods and events above; logs: kubectl -n $NAMESPACE logs deploy/tekton-pipelines-webhook)"
	fi
	wait_for "the Tekton webhook" 120 webhook_ready ||
		die "the API server does not reach Tekton's webhook (kubectl -n $NAMESPACE logs deploy/tekton-pipelines-webhook; $LOG_DIR/kube-apiserver.log)"
}

start=$SECONDS
if build_only "$@"; then
	build
	log "Tekton Pipelines $version built in $((SECONDS - start))s"
	exit 0
fi
preflight
build
load_images
manifests
deploy
log "Tekton Pipelines $version installed in $((SECONDS - start))s"
