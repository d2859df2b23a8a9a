#!/usr/bin/env bash
# One node of the local cluster: containerd and a kubelet, in a private mount
# namespace (up.sh starts this with `unshare --mount --propagation
# unchanged`). Everything containerd and the kubelet mount (container root
# filesystems, network namespaces, pod volumes) lives and dies with this
# namespace; only the node's layercache store is shared with the host.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

n=${1:?usage: node.sh NODE_NUMBER}
dir=$(node_dir "$n")
store=$(node_store "$n")
host_root=$(node_host_root "$n")

# Mounts made here must not reach the host, except below the store: make
# every other shared mount a slave (host changes still arrive).
while read -r mp opt; do
	[[ $mp == "$host_root" || $mp == "$LAYERCACHE_ROOT" || $opt != *shared:* ]] && continue
	mount --make-slave "$mp" || echo "warning: could not make $mp a slave mount; mounts below it may show on the host" >&2
done < <(awk '{ o = ""; for (i = 7; $i != "-"; i++) o = o " " $i; print $5, o }' /proc/self/mountinfo)

# The host's own mounts below its temp dir are go test's (t.TempDir: the
# unit tests, which run beside the cluster in make test), not the node's.
# This namespace starts with a copy of them, and the host's / is private
# here (no systemd to make it shared), so the host's unmount of one does
# not reach the copy: it would stay mounted until the node's next reboot,
# holding the FUSE connection under it, which a test's clean-up then
# waits for (29 Nov 2026: a lazyfs test of
# make test-unit hung for 10 minutes after TestLoadNodeReboot's reboot
# copied its layer's mount). Detach them here; the repository's (the
# cluster's own, when it is cloned below the temp dir) stay.
tmp=$(cd "${TMPDIR:-/tmp}" && pwd -P)
while read -r mp; do
	[[ $mp == "$tmp"/* && $mp != "$REPO_DIR"/* ]] || continue
	umount -l "$mp" 2>/dev/null || true
done < <(awk '{ print $5 }' /proc/self/mountinfo | sort -r)

if [[ $n != 1 ]]; then
	# Replace this namespace's copy of node 1's store (cut off from the host
	# first, so that the unmount stays here) with the node's own store,
	# joining the store's peer group. Replace, not stack: containerd checks
	# the propagation of the first mount it finds on a path, not the top one.
	mount --make-private "$LAYERCACHE_ROOT"
	umount "$LAYERCACHE_ROOT"
	mount --bind "$store" "$LAYERCACHE_ROOT"
fi

# The kubelet's directory is at its default path in every node's namespace,
# as on a real node, so that the deployed CSI driver (whose DaemonSet mounts
# /var/lib/kubelet) needs no per-node path. Shared, so that the node agent's
# mounts at CSI volumes' target paths (Bidirectional) reach the kubelet.
mount --bind "$dir/kubelet" "$KUBELET_ROOT"
mount --make-rshared "$KUBELET_ROOT"

# Shim sockets go to /run/containerd/s whatever the configuration says.
mount -t tmpfs -o mode=0711 tmpfs-lce2e /run/containerd

# The kubelet adds iptables chains for kube-proxy, which this cluster does not
# run; hide iptables from it so the host firewall is left as it was.
for tool in iptables ip6tables; do
	if path=$(command -v "$tool"); then
		mount --bind /bin/false "$(readlink -f "$path")"
	fi
done

containerd --config "$dir/containerd.toml" >>"$LOG_DIR/node$n-containerd.log" 2>&1 &
if ! wait_for "containerd of node $n" 60 ctr --address "$(containerd_sock "$n")" version; then
	echo "containerd of node $n did not start; see $LOG_DIR/node$n-containerd.log" >&2
	exit 1
fi

"$BIN_DIR/kubelet" \
	--config "$dir/kubelet.yaml" \
	--kubeconfig "$dir/kubelet.kubeconfig" \
	--hostname-override "$(node_name "$n")" \
	--node-ip "$(node_ip "$n")" \
	--root-dir "$KUBELET_ROOT" \
	--v 1 >>"$LOG_DIR/node$n-kubelet.log" 2>&1 &

wait
