#!/usr/bin/env bash
# Stop the e2e cluster and remove every process, mount and file it made:
#   - processes: the registry (registry.sh), then everything in the
#     cluster's cgroup (daemons, shims, pods);
#   - mounts: the store bind mounts, volumes below them, and anything mounted
#     from or into _output/cluster (node namespaces die with their processes),
#     and the loop devices of the snapshot layout's btrfs images;
#   - host changes: /etc/hosts lines, kubelet sysctls, bridges, cgroups;
#   - files: _output/cluster, with the registry's blobs. Build caches
#     (_output/bin, _output/images) stay.
# Safe to run at any time, any number of times.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root

if [[ -f $CLUSTER_DIR/cluster.json && $(jq -r .backend "$CLUSTER_DIR/cluster.json") == kind ]]; then
	"$CLUSTER_LIB/kind.sh" down
	rm -rf "$CLUSTER_DIR"
	exit 0
fi

problems=0

# --- processes --------------------------------------------------------------

# The registry is a host service outside the cluster's cgroup, as a
# registry is outside a real cluster: its script stops it.
"$CLUSTER_LIB/registry.sh" stop || problems=1

# Containers run in cgroups containerd names /k8s.io/<id>, outside the
# cluster's cgroup: note their ids while containerd's state still lists them.
# (find, not ls: ls of several nodes' directories prints their names too.)
mapfile -t container_ids < <(find "$CLUSTER_DIR"/node*/containerd/state/io.containerd.runtime.v2.task/k8s.io/ \
	-mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -u)

# Kubelets first, so that they do not restart the containers being stopped.
for f in "$PID_DIR"/node*.pid; do
	[[ -f $f ]] || continue
	pkill -KILL -P "$(<"$f")" -x kubelet 2>/dev/null || true
done

# Then the containers, through containerd, which also removes their cgroups
# and root filesystems.
for sock in "$CLUSTER_DIR"/node*/containerd.sock; do
	[[ -S $sock ]] || continue
	ctr_() { timeout 30 ctr --address "$sock" -n k8s.io "$@"; }
	mapfile -t tasks < <(ctr_ tasks ls -q 2>/dev/null)
	((${#tasks[@]})) || continue
	ctr_ tasks delete --force "${tasks[@]}" >/dev/null 2>&1 || true
done

# Whatever containerd could not stop: a container's first process holds its
# PID namespace; killing it ends every process in the container.
for pid in $(cgroup_pids); do
	[[ $(cat "/proc/$pid/comm" 2>/dev/null) == containerd-shim* ]] || continue
	pkill -KILL -P "$pid" 2>/dev/null || true
done

stop_all() {
	local sig=$1 pids
	pids=$(cgroup_pids)
	[[ -n $pids ]] || return 0
	# shellcheck disable=SC2086
	kill -"$sig" $pids 2>/dev/null || true
}
stop_all TERM
for ((i = 0; i < 25; i++)); do
	[[ -z $(cgroup_pids) ]] && break
	sleep 0.2
done
for ((i = 0; i < 20; i++)); do
	[[ -z $(cgroup_pids) ]] && break
	stop_all KILL
	sleep 0.5
done
if [[ -n $(cgroup_pids) ]]; then
	echo "error: processes still in cgroup $CGROUP_NAME: $(cgroup_pids | tr '\n' ' ')" >&2
	problems=1
fi

# --- mounts -----------------------------------------------------------------

# stale_store_on_root: whether the top mount at $LAYERCACHE_ROOT is node 1's
# store of a local cluster whose down.sh never ran: another clone's, or one
# whose directory is gone (a CI checkout, a session that ended mid-test).
# Its volumes' mounts stay below it, and a new store bound on top would hide
# them from the node-reboot fault and from this script.
stale_store_on_root() {
	awk -v root="$LAYERCACHE_ROOT" '$5 == root { top = $4 }
		END { exit !(top ~ /\/_output\/cluster\/node1\/layercache\/*(\/\/deleted)?$/) }' /proc/self/mountinfo
}

prefixes=("$CLUSTER_DIR")
if [[ -f $STATE_DIR/mounted-layercache-root ]] || stale_store_on_root; then
	prefixes+=("$LAYERCACHE_ROOT")
fi
# Deepest first, by path: each pass unmounts one store stacked on the root
# with its volumes, so that the one below it shows and goes next pass.
for ((pass = 0; pass < 10; pass++)); do
	mapfile -t mps < <(mounts_under "${prefixes[@]}")
	((${#mps[@]})) || break
	for mp in "${mps[@]}"; do
		umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
	done
done
mapfile -t mps < <(mounts_under "${prefixes[@]}")
if ((${#mps[@]})); then
	echo "error: mounts left: ${mps[*]}" >&2
	problems=1
fi

# Loop devices of the snapshot layout's btrfs images: layerfs attaches them
# with autoclear, so the unmounts above free them; a lazy unmount may not.
for file in /sys/block/loop*/loop/backing_file; do
	[[ -f $file ]] || continue
	backing=$(<"$file")
	for prefix in "${prefixes[@]}"; do
		[[ $backing == "$prefix"/* ]] || continue
		dev=/dev/$(basename "$(dirname "$(dirname "$file")")")
		if ! losetup -d "$dev" 2>/dev/null; then
			echo "error: loop device $dev still holds $backing" >&2
			problems=1
		fi
	done
done

# --- host changes -----------------------------------------------------------

for ((n = 1; n <= 4; n++)); do
	ip link show "$(bridge_name "$n")" >/dev/null 2>&1 && ip link delete "$(bridge_name "$n")"
	ip address del "$(node_ip "$n")/32" dev lo 2>/dev/null || true
done

if grep -q "$HOSTS_MARK" /etc/hosts; then
	# Written in place: /etc/hosts may be a bind mount that a rename would break.
	hosts=$(grep -v "$HOSTS_MARK" /etc/hosts)
	printf '%s\n' "$hosts" >/etc/hosts
fi

if [[ -f $STATE_DIR/sysctl ]]; then
	while IFS== read -r name value; do
		sysctl -q -w "$name=$value" || problems=1
	done <"$STATE_DIR/sysctl"
fi

if [[ -f $STATE_DIR/created-layercache-root ]]; then
	rmdir "$LAYERCACHE_ROOT" 2>/dev/null || echo "warning: $LAYERCACHE_ROOT is not empty; left in place" >&2
fi
if [[ -f $STATE_DIR/created-kubelet-root ]]; then
	rmdir "$KUBELET_ROOT" 2>/dev/null || echo "warning: $KUBELET_ROOT is not empty; left in place" >&2
fi
if [[ -f $STATE_DIR/created-run-containerd ]]; then
	rmdir /run/containerd 2>/dev/null || true
fi

# Leaf cgroups first; the kernel refuses to remove a cgroup with children.
while read -r mnt; do
	for id in "${container_ids[@]}"; do
		[[ -d $mnt/k8s.io/$id ]] && rmdir "$mnt/k8s.io/$id" 2>/dev/null
	done
	if [[ -f $STATE_DIR/created-cgroup-k8s.io && -d $mnt/k8s.io ]]; then
		rmdir "$mnt/k8s.io" 2>/dev/null || echo "warning: $mnt/k8s.io is not empty; left in place" >&2
	fi
	[[ -d $mnt/$CGROUP_NAME ]] || continue
	find "$mnt/$CGROUP_NAME" -depth -type d -exec rmdir {} + 2>/dev/null || true
	if [[ -d $mnt/$CGROUP_NAME ]]; then
		echo "error: could not remove cgroup $mnt/$CGROUP_NAME" >&2
		problems=1
	fi
done < <(cgroup_mounts)

# --- files ------------------------------------------------------------------

if ((problems == 0)); then
	rm -rf "$CLUSTER_DIR"
	echo "cluster removed"
else
	echo "error: cleanup incomplete; $CLUSTER_DIR kept for inspection (logs in $LOG_DIR); run $0 again" >&2
	exit 1
fi
