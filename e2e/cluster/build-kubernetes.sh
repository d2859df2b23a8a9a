#!/usr/bin/env bash
# Build the pinned Kubernetes binaries (e2e/tools/kubernetes) into
# _output/bin. About 5 minutes cold on an idle 2-core machine (280 s
# measured; one multi-call binary instead of five was no faster: 278 s, and
# the four extra links take 7 s). Without cgo, as the images, the tests and
# the tools build (the Makefile), so that their shared dependencies (the
# k8s.io modules of the same version) compile once. A stamp of the inputs skips
# even the link step when nothing changed, and the Go build cache keeps
# later rebuilds short.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tools=$REPO_DIR/e2e/tools/kubernetes
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ { print $2 }' "$tools/go.mod")
[[ -n $version ]] || die "$tools/go.mod does not require k8s.io/kubernetes"
minor=${version#v1.}
minor=${minor%%.*}
# Version stamps: nodes and `kubectl version` show the real release instead
# of v0.0.0-master.
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

# make test builds it in make e2e-build and, beside it, for test-envtest
# (envtest-assets.sh): the second waits here, then finds the stamp current.
mkdir -p "$BIN_DIR"
exec 9>"$BIN_DIR/.kubernetes.lock"
flock 9

stamp_file=$BIN_DIR/.kubernetes.stamp
stamp=$( (cat "$tools/go.mod" "$tools/go.sum"; go version; echo "$ldflags CGO_ENABLED=0") | sha256sum | cut -d' ' -f1)
up_to_date=1
for b in "${binaries[@]}"; do [[ -x $BIN_DIR/$b ]] || up_to_date=; done
if [[ -n $up_to_date && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]; then
	exit 0
fi

log "building Kubernetes $version (${binaries[*]}); about 5 minutes the first time"
mkdir -p "$BIN_DIR"
rm -f "$stamp_file"
t=$SECONDS
(cd "$tools" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" go build -ldflags "$ldflags" -o "$BIN_DIR/" tool)
echo "$stamp" >"$stamp_file"
log "built Kubernetes binaries in $((SECONDS - t))s"
