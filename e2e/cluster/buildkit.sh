#!/usr/bin/env bash
# Build BuildKit's image for the image-builder scenarios (make up
# WITH=buildkit; make e2e asks for it).
#
#   e2e/cluster/buildkit.sh [--build-only]
#
# --build-only builds the binaries and images and stops (make e2e-build).
#
# Builds the pinned release (e2e/tools/buildkit: buildkitd and buildctl,
# static) with `go build` into _output/bin/buildkit, and the image
# localhost/buildkit:e2e without Docker (hack/imagebuild), then imports it
# into every node's containerd. Nothing is deployed: the scenarios
# (e2e/imagebuild) run buildkitd in their own privileged pods, as GitLab's
# docker:dind services and Tekton's buildkit task do.
#
# The image holds:
#   /usr/bin/buildkitd, /usr/bin/buildctl   static (CGO_ENABLED=0)
#   /usr/sbin/runc                          the host's (Debian's runc, which
#                                           the cluster's containerd runs too)
#                                           with the shared libraries ldd
#                                           lists; buildkitd's OCI worker runs
#                                           each RUN step with it
#   /bin/busybox and its applets            a shell for the pods' scripts
#   /oci/busybox/                           the e2e busybox image as an OCI
#                                           layout: no registry is reachable,
#                                           so builds start FROM it as a named
#                                           context (buildctl --oci-layout
#                                           base=/oci/busybox --opt
#                                           context:busybox=oci-layout://base@DIGEST);
#                                           /oci/busybox.digest names DIGEST
#
# Cost, for CI's budget (make test on 2 cores): the first build of
# buildkitd and buildctl is about 3 minutes of CPU, 3-5 minutes of wall
# time on 2 cores (3 min 21 s here; 5 min 9 s with an empty GOCACHE while
# other work ran); with the Go build cache warm it is a 5 s link. Later
# runs skip the build, and the image, when their inputs (the tools module,
# this script, the Go version, busybox.tar, runc) are unchanged.
# Assembling the image (39 MB) takes about 6 s, importing it under 1 s per
# node.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TOOLS=$REPO_DIR/e2e/tools/buildkit
MODULE=github.com/moby/buildkit
COMMANDS=(buildkitd buildctl)
BUILDKIT_BIN=$BIN_DIR/buildkit
BUILDKIT_OUT=$OUT_DIR/buildkit
IMAGE=localhost/buildkit:e2e
ARCHIVE=$BUILDKIT_OUT/images/buildkit.tar

version=$(tools_version "$TOOLS" "$MODULE")

preflight() {
	require_local_cluster BuildKit buildkit
	require_image_inputs
}

# require_image_inputs: the image holds the e2e busybox and the host's runc.
require_image_inputs() {
	[[ -f $IMAGES_DIR/busybox.tar ]] || die "$IMAGES_DIR/busybox.tar is missing: run make up or make e2e-build first (they build the e2e images)"
	command -v runc >/dev/null || die "no runc on this host: make up installs Debian's runc with containerd; run it first"
}

# build_binaries: buildkitd and buildctl, skipped (even the link) when the
# tools module, the Go version and this script are unchanged.
build_binaries() {
	local stamp_file=$BUILDKIT_BIN/.stamp stamp
	stamp=$(tools_stamp "$TOOLS" "${BASH_SOURCE[0]}")
	if [[ -x $BUILDKIT_BIN/buildkitd && -x $BUILDKIT_BIN/buildctl && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]; then
		return
	fi
	log "building BuildKit $version (${COMMANDS[*]}); about 3 minutes the first time"
	local t=$SECONDS
	mkdir -p "$BUILDKIT_BIN"
	rm -f "$stamp_file"
	# Static, with the release's version, as upstream's Dockerfile builds
	# them (CGO_ENABLED=0, -X .../version.Version).
	(cd "$TOOLS" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
		go build -trimpath -ldflags "-s -w -X $MODULE/version.Version=$version" -o "$BUILDKIT_BIN/" tool) ||
		die "building $MODULE in $TOOLS failed; see above"
	log "built BuildKit in $((SECONDS - t))s"
	echo "$stamp" >"$stamp_file"
}

# runc_files prints buildimage --file arguments (two lines each) for the
# host's runc and every shared library it loads, the dynamic loader
# included, each at the path the binary asks for.
runc_files() { "$REPO_DIR/hack/imagebuild/with-libs.sh" runc; }

# build_image: the image, skipped when its inputs are unchanged: the
# binaries, busybox.tar, runc and its libraries, this script and the two
# Go commands that write the image.
build_image() {
	local stamp_file=$BUILDKIT_OUT/images/.stamp stamp
	stamp=$({
		runc_files | grep -vx -- --file | sed 's/:[^:]*$//' | xargs cat
		cat "$BUILDKIT_BIN/.stamp" "$IMAGES_DIR/busybox.tar" "${BASH_SOURCE[0]}" \
			"$REPO_DIR"/hack/imagebuild/*.go "$REPO_DIR"/hack/imagebuild/cmd/buildimage/*.go \
			"$REPO_DIR"/e2e/imagebuild/cmd/oci-layout/*.go "$REPO_DIR/hack/imagebuild/with-libs.sh"
	} | sha256sum | cut -d' ' -f1)
	if [[ -f $ARCHIVE && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]; then
		return
	fi
	log "building $IMAGE"
	mkdir -p "$BUILDKIT_OUT/images"
	rm -f "$stamp_file"
	local layout=$BUILDKIT_OUT/oci/busybox digest tool=$BUILDKIT_BIN/buildimage f
	rm -rf "$layout"
	mkdir -p "$(dirname "$layout")"
	(cd "$REPO_DIR" && go build -o "$BUILDKIT_BIN/" ./hack/imagebuild/cmd/buildimage ./e2e/imagebuild/cmd/oci-layout)
	digest=$("$BUILDKIT_BIN/oci-layout" --archive "$IMAGES_DIR/busybox.tar" --ref "$IMAGE_BUSYBOX" --output "$layout")
	echo "$digest" >"$BUILDKIT_OUT/oci/busybox.digest"
	local args=(--output "$ARCHIVE" --ref "$IMAGE" --busybox "$(busybox_path)" --tmpdir /tmp
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/sh
		--file "$BUILDKIT_OUT/oci/busybox.digest:/oci/busybox.digest")
	for c in "${COMMANDS[@]}"; do args+=(--file "$BUILDKIT_BIN/$c:/usr/bin/$c"); done
	while read -r f; do args+=("$f"); done < <(runc_files)
	while read -r f; do
		args+=(--file "$layout/$f:/oci/busybox/$f")
	done < <(cd "$layout" && find . -type f -printf '%P\n' | sort)
	"$tool" "${args[@]}" >/dev/null
	echo "$stamp" >"$stamp_file"
}

# busybox_path: the static busybox up.sh fetched for the e2e busybox image.
busybox_path() {
	local b=$IMAGES_DIR/busybox-static/bin/busybox
	[[ -x $b ]] || die "$b is missing: run make up first (it fetches Debian's busybox-static)"
	echo "$b"
}

# load_image imports the image into every node's containerd, as up.sh
# loads the project's; no pod reaches for a registry.
load_image() {
	local n
	for ((n = 1; n <= NODE_COUNT; n++)); do
		ctr --address "$(containerd_sock "$n")" -n k8s.io images import "$ARCHIVE" >/dev/null ||
			die "importing $ARCHIVE into node $n failed"
	done
	log "loaded $IMAGE (BuildKit $version) into $NODE_COUNT node(s)"
}

start=$SECONDS
if build_only "$@"; then
	require_image_inputs
	build_binaries
	build_image
	log "BuildKit $version built in $((SECONDS - start))s"
	exit 0
fi
preflight
build_binaries
build_image
load_image
log "BuildKit $version ready in $((SECONDS - start))s"
