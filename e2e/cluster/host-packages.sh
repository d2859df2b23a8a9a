#!/usr/bin/env bash
# Install every Debian package make test needs, in one apt transaction:
# what the unit tests check images and btrfs stores with (erofs-utils,
# btrfs-progs), the local cluster's containerd, runc, CNI plugins and etcd,
# and the two-node cluster's registry (docker-registry, its service kept
# off by registry.sh install). make test runs it first because its later
# stages run side by side, and two apt-get processes at once fail on
# dpkg's lock.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_root
mapfile -t missing < <(missing_cluster_packages)
command -v fsck.erofs >/dev/null || missing+=(erofs-utils)
command -v docker-registry >/dev/null || missing+=(docker-registry)
apt_install "${missing[@]}"
"$CLUSTER_LIB/registry.sh" install
