#!/usr/bin/env bash
# make bench-e2e: layercache against rancher/local-path-provisioner on the
# cluster that `make up` started, in one run.
#
#   e2e/bench/run.sh
#
# Builds local-path-provisioner v0.0.33 from its Go module
# (e2e/tools/local-path), builds its image without Docker
# (hack/imagebuild), imports it into every node's containerd, deploys it
# (e2e/bench/manifests/local-path.yaml), runs TestBenchPeer, then
# TestBenchCSI (layercache's CSI inline volumes against emptyDir and
# hostPath, which needs no peer but the cluster's registry: one variant is
# a CSI volume of its StorageClass), prints both tables and removes the
# peer again. Results, the test logs and the peer's log go to _output/bench.
#
# Environment: BENCH_RUNS (runs per system and case, default 5),
# BENCH_BIG_FILES and BENCH_BIG_BYTES (the big cache, default 50000 files,
# 1Gi), BENCH_NODE (default the first node), BENCH_TIMEOUT (go test
# -timeout, default 60m), BENCH_CSI_TIMEOUT (TestBenchCSI's, default 30m),
# BENCH_KEEP_PEER=1 (leave the peer deployed).
set -euo pipefail
# shellcheck source=../cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

BENCH_SRC=$REPO_DIR/e2e/bench
BENCH_OUT=$OUT_DIR/bench
CLUSTER_JSON=$CLUSTER_DIR/cluster.json
PEER_TOOLS=$REPO_DIR/e2e/tools/local-path
PEER_MODULE=github.com/rancher/local-path-provisioner
PEER_BIN=$BIN_DIR/local-path-provisioner
PEER_IMAGE=localhost/local-path-provisioner:e2e
PEER_ARCHIVE=$BENCH_OUT/local-path-provisioner.tar
PEER_MANIFEST=$BENCH_SRC/manifests/local-path.yaml
# As in the manifest; the unit tests of e2e/bench check the manifest.
PEER_NAMESPACE=local-path-bench
PEER_DEPLOYMENT=local-path-provisioner
PEER_STORAGE_CLASS=local-path-bench

preflight() {
	[[ -f $KUBECONFIG_FILE && -f $CLUSTER_JSON ]] ||
		die "no cluster: $KUBECONFIG_FILE or $CLUSTER_JSON is missing; run make bench-e2e (it starts the cluster with make up first)"
	local tool
	for tool in go jq; do
		command -v "$tool" >/dev/null || die "$tool is not installed; make up installs what the cluster needs, install $tool too"
	done
	kubectl get --raw /readyz >/dev/null 2>&1 ||
		die "the cluster's API server is not ready (kubeconfig $KUBECONFIG_FILE); run make up"
	BACKEND=$(jq -r .backend "$CLUSTER_JSON")
	NODE_COUNT=$(jq '.nodes | length' "$CLUSTER_JSON")
	case $BACKEND in
	local)
		require_root
		command -v ctr >/dev/null || die "ctr is not installed; make up installs containerd, which has it"
		;;
	kind) command -v docker >/dev/null || die "the kind backend needs docker" ;;
	*) die "$CLUSTER_JSON names backend '$BACKEND'; want local or kind" ;;
	esac
	# TestBenchCSI's registry variant (a CSI volume of this class) needs
	# the registry; fail before the peer's 3-minute build, not after.
	local no_registry="make bench-e2e starts the cluster with the registry (make up WITH=registry; the local backend only)"
	[[ $(jq -r '.registry.storageClass // empty' "$CLUSTER_JSON") == "$REGISTRY_STORAGECLASS" ]] ||
		die "$CLUSTER_JSON has no registry with StorageClass $REGISTRY_STORAGECLASS, which TestBenchCSI's registry variant uses; $no_registry"
	kubectl get storageclass "$REGISTRY_STORAGECLASS" >/dev/null 2>&1 ||
		die "StorageClass $REGISTRY_STORAGECLASS is missing, which TestBenchCSI's registry variant uses; $no_registry"
	mkdir -p "$BENCH_OUT"
}

# build_peer builds local-path-provisioner from the tools module, whose
# go.sum pins and verifies it (-mod=readonly: never rewritten here).
build_peer() {
	local version
	version=$(awk -v m="$PEER_MODULE" '$1 == m && $2 ~ /^v/ { print $2 }' "$PEER_TOOLS/go.mod")
	[[ -n $version ]] || die "$PEER_TOOLS/go.mod does not require $PEER_MODULE"
	log "building local-path-provisioner $version (about 3 minutes the first time on 2 cores)"
	mkdir -p "$BIN_DIR"
	# Upstream's scripts/build stamps the version the same way.
	(cd "$PEER_TOOLS" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
		go build -trimpath -ldflags "-s -w -X main.VERSION=$version" -o "$PEER_BIN" "$PEER_MODULE") ||
		die "building $PEER_MODULE in $PEER_TOOLS failed; see above"
}

# build_peer_image writes the image archive: the static binary, no base
# image, as the harness builds localhost/layercache:dev.
build_peer_image() {
	log "building image $PEER_IMAGE"
	local tool=$BENCH_OUT/bin/buildimage
	mkdir -p "$(dirname "$tool")"
	(cd "$REPO_DIR" && go build -o "$tool" ./hack/imagebuild/cmd/buildimage)
	"$tool" --output "$PEER_ARCHIVE" --ref "$PEER_IMAGE" \
		--file "$PEER_BIN:/local-path-provisioner" --entrypoint /local-path-provisioner >/dev/null
}

# import_image SOCKET ARCHIVE: load an image archive into the containerd
# listening on SOCKET, in the namespace the kubelet uses, as up.sh loads
# the project's images.
import_image() {
	local sock=$1 archive=$2
	ctr --address "$sock" version >/dev/null 2>&1 ||
		die "no containerd answers on $sock; is the cluster running? (make up)"
	ctr --address "$sock" -n k8s.io images import "$archive" >/dev/null ||
		die "importing $archive through $sock failed"
}

# import_image_kind CONTAINER ARCHIVE: the same for a kind node, as `kind
# load image-archive` does it.
import_image_kind() {
	docker exec -i "$1" ctr --namespace=k8s.io images import --digests --snapshotter=overlayfs - <"$2" >/dev/null ||
		die "importing $2 into kind node $1 failed"
}

load_peer_image() {
	local n
	for ((n = 1; n <= NODE_COUNT; n++)); do
		case $BACKEND in
		local) import_image "$(containerd_sock "$n")" "$PEER_ARCHIVE" ;;
		kind) import_image_kind "$(jq -r ".nodes[$((n - 1))].container" "$CLUSTER_JSON")" "$PEER_ARCHIVE" ;;
		esac
	done
	log "loaded $PEER_IMAGE into $NODE_COUNT node(s)"
}

deploy_peer() {
	log "deploying local-path-provisioner (namespace $PEER_NAMESPACE, StorageClass $PEER_STORAGE_CLASS)"
	local existed=
	if kubectl -n "$PEER_NAMESPACE" get deployment "$PEER_DEPLOYMENT" >/dev/null 2>&1; then existed=1; fi
	kubectl apply -f "$PEER_MANIFEST" >/dev/null
	if [[ -n $existed ]]; then
		# Left by an interrupted run: restart it on the image just imported.
		kubectl -n "$PEER_NAMESPACE" rollout restart deployment "$PEER_DEPLOYMENT" >/dev/null
	fi
	if ! kubectl -n "$PEER_NAMESPACE" rollout status deployment "$PEER_DEPLOYMENT" --timeout=180s >/dev/null; then
		kubectl -n "$PEER_NAMESPACE" get pods -o wide >&2 || true
		kubectl -n "$PEER_NAMESPACE" logs deployment/"$PEER_DEPLOYMENT" --tail=50 >&2 || true
		die "local-path-provisioner did not become ready within 3 minutes; its pods and log are above"
	fi
}

no_peer_volumes() {
	[[ -z $(kubectl get pv -o jsonpath="{range .items[?(@.spec.storageClassName==\"$PEER_STORAGE_CLASS\")]}{.metadata.name}{\"\\n\"}{end}") ]]
}

# remove_peer runs on exit: it keeps the peer's log and removes the peer,
# but only once none of its volumes is left, or their directories would
# stay on the node for good.
remove_peer() {
	kubectl -n "$PEER_NAMESPACE" logs deployment/"$PEER_DEPLOYMENT" >"$BENCH_OUT/local-path-provisioner.log" 2>&1 || true
	if [[ -n ${BENCH_KEEP_PEER:-} ]]; then
		log "keeping local-path-provisioner deployed (BENCH_KEEP_PEER is set); remove it with: kubectl delete -f $PEER_MANIFEST"
		return
	fi
	if ! wait_for "the peer's volumes to go" 180 no_peer_volumes; then
		log "warning: PVs of StorageClass $PEER_STORAGE_CLASS remain (kubectl get pv); local-path-provisioner stays deployed so it can remove them, then: kubectl delete -f $PEER_MANIFEST"
		return
	fi
	log "removing local-path-provisioner"
	kubectl delete -f "$PEER_MANIFEST" --ignore-not-found --wait --timeout=180s >/dev/null ||
		log "warning: removing local-path-provisioner failed; retry with: kubectl delete -f $PEER_MANIFEST"
}

run_benchmark() {
	rm -f "$BENCH_OUT/results.json" "$BENCH_OUT/results.txt" "$BENCH_OUT/csi.json" "$BENCH_OUT/csi.txt"
	log "running TestBenchPeer: ${BENCH_RUNS:-5} runs per system and case (about 10 to 20 minutes); log: $BENCH_OUT/test.log"
	local rc=0 csi_rc=0
	(cd "$REPO_DIR" && BENCH_OUTPUT="$BENCH_OUT" KUBECONFIG="$KUBECONFIG_FILE" \
		go test -tags e2e,benchpeer -run '^TestBenchPeer$' -count=1 -v -timeout "${BENCH_TIMEOUT:-60m}" ./e2e/bench/) 2>&1 |
		tee "$BENCH_OUT/test.log" || rc=$?
	# The CSI figures need no peer; they run in a go test of their own, so
	# that each has the whole of its -timeout.
	log "running TestBenchCSI: ${BENCH_RUNS:-5} runs per variant (about 5 to 11 minutes); log: $BENCH_OUT/csi-test.log"
	(cd "$REPO_DIR" && BENCH_OUTPUT="$BENCH_OUT" KUBECONFIG="$KUBECONFIG_FILE" \
		go test -tags e2e,benchpeer -run '^TestBenchCSI$' -count=1 -v -timeout "${BENCH_CSI_TIMEOUT:-30m}" ./e2e/bench/) 2>&1 |
		tee "$BENCH_OUT/csi-test.log" || csi_rc=$?
	echo
	[[ -f $BENCH_OUT/results.txt ]] && cat "$BENCH_OUT/results.txt" && echo
	[[ -f $BENCH_OUT/csi.txt ]] && cat "$BENCH_OUT/csi.txt" && echo
	if ((rc != 0)) || [[ ! -f $BENCH_OUT/results.txt ]]; then
		die "the benchmark failed (exit $rc). Test log: $BENCH_OUT/test.log (a failed test writes its pods, their logs and events there); local-path-provisioner's log: $BENCH_OUT/local-path-provisioner.log"
	fi
	if ((csi_rc != 0)) || [[ ! -f $BENCH_OUT/csi.txt ]]; then
		die "the CSI benchmark failed (exit $csi_rc); a clear miss of a target fails it, csi.txt above says which. Test log: $BENCH_OUT/csi-test.log"
	fi
	echo "results: $BENCH_OUT/results.json, $BENCH_OUT/csi.json"
}

start=$SECONDS
preflight
build_peer
build_peer_image
load_peer_image
trap remove_peer EXIT
deploy_peer
run_benchmark
log "benchmark done in $((SECONDS - start))s"
