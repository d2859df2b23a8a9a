#!/usr/bin/env bash
# Install every Debian package make test needs, in one apt transaction:
# what the unit tests check images and btrfs stores with (erofs-utils,
# btrfs-progs), the local cluster's containerd, runc, CNI plugins and etcd,
# and the two-node cluster's registry (docker-registry, its service kept
# off by registry.sh install), and prometheus (promtool checks and tests
# config/monitoring's rules; e2e/monitoring runs the server on loopback;
# apt_install's policy-rc.d keeps its service from starting; the
# end of this script disables it). make test runs it first because its later
# stages run side by side, and two apt-get processes at once fail on
# dpkg's lock.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_root
mapfile -t missing < <(missing_cluster_packages)
command -v fsck.erofs >/dev/null || missing+=(erofs-utils)
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v promtool >/dev/null || missing+=(prometheus)
apt_install "${missing[@]}"
"$CLUSTER_LIB/registry.sh" install
# The Debian package enables prometheus.service; make test wants only its
# binaries, so keep the unit off (no-op without systemd).
if command -v systemctl >/dev/null && systemctl list-unit-files prometheus.service >/dev/null 2>&1; then
	systemctl disable --now prometheus.service prometheus-node-exporter.service >/dev/null 2>&1 || true
fi
