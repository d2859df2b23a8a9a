#!/usr/bin/env bash
# Install Argo Workflows into the local e2e cluster (make up WITH=argo;
# make e2e asks for it).
#
#   e2e/cluster/argo.sh [--build-only]
#
# --build-only builds the binaries and images and stops (make e2e-build).
#
# Builds the pinned release (e2e/tools/argo: workflow-controller and
# argoexec) with `go build` into _output/bin/argo, skipped when its inputs
# are unchanged; builds their images without Docker (hack/imagebuild);
# imports them into every node's containerd; writes the manifests from the
# module's own manifests/ (e2e/argo/cmd/argo-manifests) to
# _output/argo/argo.yaml, applies them and waits until the controller leads
# and answers its health check.
#
# The local cluster has no kube-proxy and no route between the host and
# the pod network, and the API server listens on 127.0.0.1 only. So:
# - the controller runs on the host network with
#   KUBERNETES_SERVICE_HOST=127.0.0.1 (as layercache's and Tekton's pods);
# - the executor (the init and wait containers Argo adds to every workflow
#   pod) talks to the API server too: the wait container reports the step's
#   outputs as a WorkflowTaskResult. The controller's ConfigMap gives it
#   KUBERNETES_SERVICE_HOST=127.0.0.1 and makes hostNetwork: true the
#   default of every Workflow (workflowDefaults), so that 127.0.0.1 is the
#   node's loopback where the API server listens. A Workflow that sets
#   hostNetwork: false here cannot report its outputs.
# Argo's webhook-free design needs nothing else: the argo-server (UI and
# API) is left out.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TOOLS=$REPO_DIR/e2e/tools/argo
MODULE=github.com/argoproj/argo-workflows/v3
COMMANDS=(workflow-controller argoexec)
ARGO_BIN=$BIN_DIR/argo
ARGO_OUT=$OUT_DIR/argo
IMAGE_PREFIX=localhost/argo-
NAMESPACE=argo
# The controller's health endpoint; upstream's fixed :6060 on the host.
HEALTHZ_PORT=6060

version=$(tools_version "$TOOLS" "$MODULE")

preflight() { require_local_cluster "Argo Workflows" argo; }

# build: the binaries and their images, skipped (even the link) when the
# tools module, the Go version and this script are unchanged. About 7
# minutes cold on 2 cores (6 min 45 s with an empty GOCACHE, see
# e2e/README.md); the Go build cache keeps rebuilds short.
build() {
	local stamp_file=$ARGO_BIN/.stamp stamp
	stamp=$(tools_stamp "$TOOLS" "${BASH_SOURCE[0]}")
	if tools_built "$stamp" "$ARGO_BIN" "$ARGO_OUT/images" "${COMMANDS[@]}"; then
		return
	fi
	log "building Argo Workflows $version (${COMMANDS[*]}); about 7 minutes the first time"
	local t=$SECONDS
	mkdir -p "$ARGO_BIN" "$ARGO_OUT/images"
	rm -f "$stamp_file"
	# The module as the proxy serves it lacks one file argoexec needs on
	# Linux: upstream's workflow/executor/osspecific/signal_linux.go is a
	# symlink to signal_darwin.go, and module zips leave symlinks out
	# ("undefined: Setpgid"). The Go command refuses overlays of the module
	# cache, so the build uses a copy of the verified module with the link
	# put back, as git checks it out upstream, through a workspace
	# (_output/argo/go.work) that replaces the module by it; go.mod and
	# go.sum still pin every other module.
	local dir src=$ARGO_OUT/src work=$ARGO_OUT/go.work
	dir=$(cd "$TOOLS" && go mod download -json "$MODULE@$version" | jq -r .Dir)
	[[ -f $dir/workflow/executor/osspecific/signal_darwin.go ]] ||
		die "no workflow/executor/osspecific/signal_darwin.go in $MODULE@$version: the link signal_linux.go needs a new target"
	[[ ! -e $dir/workflow/executor/osspecific/signal_linux.go ]] ||
		die "$MODULE@$version now has workflow/executor/osspecific/signal_linux.go: build from the module cache again"
	rm -rf "$src"
	cp -a "$dir" "$src"
	chmod -R u+w "$src"
	ln -s signal_darwin.go "$src/workflow/executor/osspecific/signal_linux.go"
	printf 'go %s\n\nuse %s\n\nreplace %s %s => %s\n' \
		"$(awk '$1 == "go" { print $2 }' "$TOOLS/go.mod")" "$TOOLS" "$MODULE" "$version" "$src" >"$work"
	# Static binaries with the release's version, as upstream's Makefile
	# builds them (CGO_ENABLED=0, -X ...v3.version).
	(cd "$TOOLS" && CGO_ENABLED=0 GOWORK=$work GOFLAGS="-mod=readonly -buildvcs=false" \
		go build -trimpath -ldflags "-s -w -X $MODULE.version=$version" -o "$ARGO_BIN/" tool) ||
		die "building $MODULE in $TOOLS failed; see above"
	log "built Argo binaries in $((SECONDS - t))s; building images"
	local tool=$ARGO_BIN/buildimage
	(cd "$REPO_DIR" && go build -o "$tool" ./hack/imagebuild/cmd/buildimage)
	# Each image is its static binary in /bin, as upstream's distroless
	# images have it, found through PATH: the controller's Deployment runs
	# `workflow-controller`, and workflow pods run `argoexec init|wait`
	# (the init container copies argoexec into the pod's /var/run/argo for
	# the main container's emissary). No user database: the Deployment and
	# the workflow pods give a numeric user.
	for c in "${COMMANDS[@]}"; do
		"$tool" --output "$ARGO_OUT/images/$c.tar" --ref "$IMAGE_PREFIX$c:$version" \
			--file "$ARGO_BIN/$c:/bin/$c" --entrypoint "$c" --env PATH=/bin --tmpdir /tmp >/dev/null
	done
	echo "$stamp" >"$stamp_file"
}

# load_images imports the images into every node's containerd, as up.sh
# loads the project's; no pod reaches for a registry.
load_images() {
	local n c sock
	for ((n = 1; n <= NODE_COUNT; n++)); do
		sock=$(containerd_sock "$n")
		for c in "${COMMANDS[@]}"; do
			ctr --address "$sock" -n k8s.io images import "$ARGO_OUT/images/$c.tar" >/dev/null ||
				die "importing $ARGO_OUT/images/$c.tar into node $n failed"
		done
	done
	log "loaded ${IMAGE_PREFIX}{$(
		IFS=,
		echo "${COMMANDS[*]}"
	)}:$version into $NODE_COUNT node(s)"
}

manifests() {
	local dir
	dir=$(cd "$TOOLS" && go mod download -json "$MODULE@$version" | jq -r .Dir)/manifests
	[[ -d $dir ]] || die "no manifests/ in the module cache for $MODULE@$version ($dir)"
	(cd "$REPO_DIR" && go run ./e2e/argo/cmd/argo-manifests --manifests "$dir" --version "$version" \
		--image-prefix "$IMAGE_PREFIX" --namespace "$NAMESPACE" \
		--host-network --apiserver "127.0.0.1:$APISERVER_PORT") >"$ARGO_OUT/argo.yaml.new"
	mv "$ARGO_OUT/argo.yaml.new" "$ARGO_OUT/argo.yaml"
}

# controller_ready: the controller holds its leader lease (it reconciles
# only then) and its health check passes.
controller_ready() {
	local holder
	holder=$(kubectl -n "$NAMESPACE" get lease workflow-controller -o jsonpath='{.spec.holderIdentity}' 2>/dev/null) || return 1
	[[ -n $holder ]] && kubectl -n "$NAMESPACE" get pod "$holder" >/dev/null 2>&1 &&
		curl -fsS -o /dev/null "http://127.0.0.1:$HEALTHZ_PORT/healthz"
}

deploy() {
	log "applying Argo Workflows $version ($ARGO_OUT/argo.yaml)"
	kubectl apply --server-side --force-conflicts -f "$ARGO_OUT/argo.yaml" >/dev/null
	# Same tags, new content after a rebuild, or a new ConfigMap (the
	# controller reads it at start and on change, but the executor's
	# settings only reach new pods): restart on it.
	local digest stamp=$ARGO_OUT/deployed-images
	digest=$(cat "$ARGO_OUT"/images/*.tar "$ARGO_OUT/argo.yaml" | sha256sum | cut -d' ' -f1)
	if [[ -f $stamp && $(<"$stamp") != "$digest" ]]; then
		kubectl -n "$NAMESPACE" rollout restart deployment >/dev/null
	fi
	echo "$digest" >"$stamp"
	if ! kubectl -n "$NAMESPACE" rollout status deployment --timeout=180s >/dev/null; then
		kubectl -n "$NAMESPACE" get pods -o wide >&2 || true
		kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp 2>&1 | tail -20 >&2 || true
		die "Argo Workflows did not roll out in 180s (pods and events above; logs: kubectl -n $NAMESPACE logs deploy/workflow-controller)"
	fi
	wait_for "the Argo workflow controller" 120 controller_ready ||
		die "the Argo workflow controller does not lead or is not healthy (kubectl -n $NAMESPACE logs deploy/workflow-controller)"
}

start=$SECONDS
if build_only "$@"; then
	build
	log "Argo Workflows $version built in $((SECONDS - start))s"
	exit 0
fi
preflight
build
load_images
manifests
deploy
log "Argo Workflows $version installed in $((SECONDS - start))s"
