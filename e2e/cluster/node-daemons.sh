#!/usr/bin/env bash
# Stop and start one local node's containerd and kubelet, as a node
# restart whose containers keep running under their shims (e2e/soak's
# node-restart fault, SOAK_FAULT=node-restart), or reboot the node
# (SOAK_FAULT=node-reboot).
#
#   node-daemons.sh stop N    # TERM the kubelet, then containerd (KILL after 20 s each);
#                             # first records each one's command line, environment,
#                             # working directory and log file from /proc, and starts a
#                             # holder of node N's mount namespace
#   node-daemons.sh start N   # containerd, then the kubelet, with exactly what stop
#                             # recorded, in node N's mount namespace, under a new node
#                             # process (node<N>.pid, as up.sh's node.sh: down.sh finds
#                             # the kubelet as its child, e2e/framework the pid in
#                             # cluster.json); returns once containerd
#                             # answers and the kubelet's /healthz is ok
#   node-daemons.sh reboot N  # node N reboots, all but the kernel: SIGKILL of its node
#                             # process, containerd, the kubelet, its shims and every
#                             # process of its containers (the node agent's too); the
#                             # unmount of every mount below its store on the host (its
#                             # other mounts die with its namespace); the removal of what
#                             # a real node keeps on tmpfs (containerd's and runc's state)
#                             # and of the containers' emptied cgroups; then node.sh in a
#                             # new mount namespace, as up.sh starts it; returns as start
#   node-daemons.sh status N  # exit 0 when both run and the kubelet is healthy
#
# The kernel is not rebooted: /proc/sys/kernel/random/boot_id stays, and
# with it the page cache, so layerfs sees no torn volume (its own tests
# cover that path). The store's files stay, as on a disk.
#
# All verbs are idempotent: stop leaves a stopped daemon alone, start a
# running one, reboot of a node that is down only boots it. node.sh
# (started by up.sh in a private mount namespace) ends once both its
# daemons have; after stop the namespace lives on in the shims and in the
# holder, and everything node.sh mounted there (the kubelet's directory,
# /run/containerd) with it; after reboot's kills it is gone.
#
# LAYERCACHE_CLUSTER_DIR names the cluster's directory when it is not this
# checkout's _output/cluster.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -n ${LAYERCACHE_CLUSTER_DIR:-} ]]; then
	CLUSTER_DIR=$LAYERCACHE_CLUSTER_DIR
	LOG_DIR=$CLUSTER_DIR/logs
	PID_DIR=$CLUSTER_DIR/pids
	STATE_DIR=$CLUSTER_DIR/state
fi
# Start order; stop goes the other way.
DAEMONS=(containerd kubelet)
STOP_SECONDS=20
# The holder keeps the namespace for at most this long (a start that
# never comes; down.sh also kills it, as it is in the cluster's cgroup).
HOLD_SECONDS=1800

n=${2:-}
[[ $n =~ ^[0-9]+$ ]] || die "usage: $0 stop|start|reboot|status|run NODE_NUMBER"
SAVED_DIR=$STATE_DIR/node$n-daemons
NODE_PID_FILE=$PID_DIR/node$n.pid
HOLDER_PID_FILE=$PID_DIR/node$n-ns.pid

# daemon_pid NAME: the pid of node n's NAME: the child of the node
# process (node.sh, or the run of a start) named NAME.
daemon_pid() {
	local name=$1 parent
	[[ -f $NODE_PID_FILE ]] || return 0
	parent=$(<"$NODE_PID_FILE")
	pgrep -P "$parent" -x "$name" | head -1 || true
}

# stop_one NAME PID: TERM, then KILL after STOP_SECONDS.
stop_one() {
	local name=$1 pid=$2
	log "stopping $name of node $n (pid $pid)"
	terminate "$name" "$pid" "$STOP_SECONDS"
}

holder() {
	local pid
	[[ -f $HOLDER_PID_FILE ]] || return 0
	pid=$(<"$HOLDER_PID_FILE")
	[[ $(cat "/proc/$pid/comm" 2>/dev/null) == sleep ]] && echo "$pid"
	return 0
}

stop() {
	local node
	[[ -f $NODE_PID_FILE ]] || die "no node $n at $CLUSTER_DIR (no $NODE_PID_FILE); run make up"
	node=$(<"$NODE_PID_FILE")
	if [[ -z $(holder) ]]; then
		[[ -e /proc/$node/ns/mnt ]] || die "node $n's process $node is gone: its mount namespace cannot be held"
		launch "node$n-ns" nsenter --mount="/proc/$node/ns/mnt" -- sleep "$HOLD_SECONDS"
		wait_for "the holder of node $n's namespace" 10 holder_runs || die "the holder of node $n's mount namespace did not start; see $LOG_DIR/node$n-ns.log"
	fi
	# The daemons' pids first (found as the node process's children), then
	# the node process itself, so that a start's run does not start its
	# kubelet again (node.sh would only stop waiting), then the daemons.
	local pids=() name pid
	for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
		name=${DAEMONS[i]}
		pid=$(daemon_pid "$name")
		if [[ -z $pid ]]; then
			log "$name of node $n is not running"
			pids+=("")
			continue
		fi
		save_process "$SAVED_DIR" "$name" "$pid"
		pids+=("$pid")
	done
	kill -TERM "$node" 2>/dev/null || true
	for ((i = ${#DAEMONS[@]} - 1, j = 0; i >= 0; i--, j++)); do
		[[ -z ${pids[j]} ]] || stop_one "${DAEMONS[i]}" "${pids[j]}"
	done
}
holder_runs() { [[ -n $(holder) ]]; }

kubelet_ok() { curl -sf "http://127.0.0.1:$(kubelet_healthz_port "$n")/healthz"; }

start() {
	local h name
	if [[ -n $(daemon_pid kubelet) && -n $(daemon_pid containerd) ]]; then
		log "containerd and the kubelet of node $n are running"
	elif [[ -n $(daemon_pid containerd) ]] && grep -qz 'node-daemons.sh' "/proc/$(<"$NODE_PID_FILE")/cmdline" 2>/dev/null; then
		log "the node process of node $n (a start's) runs containerd and restarts its kubelet"
	else
		for name in "${DAEMONS[@]}"; do
			[[ -s $SAVED_DIR/$name.cmdline ]] ||
				die "no recorded command line of $name in $SAVED_DIR: only what node-daemons.sh stop stopped can be started (or run make down; make up)"
		done
		h=$(holder)
		[[ -n $h ]] || die "no holder of node $n's mount namespace ($HOLDER_PID_FILE): run make down; make up"
		log "starting containerd and the kubelet of node $n in the namespace of pid $h"
		launch "node$n" nsenter --mount="/proc/$h/ns/mnt" -- "$CLUSTER_LIB/node-daemons.sh" run "$n"
		record_node_pid
	fi
	wait_up "$(cat "$SAVED_DIR/containerd.log" 2>/dev/null)" "$(cat "$SAVED_DIR/kubelet.log" 2>/dev/null)"
	h=$(holder)
	if [[ -n $h ]]; then kill "$h"; fi
	rm -f "$HOLDER_PID_FILE"
	log "containerd and the kubelet of node $n are up"
}

# record_node_pid: the node's process in cluster.json (e2e/framework
# enters the node's namespace through it) is the new one.
record_node_pid() {
	jq --arg name "$(node_name "$n")" --argjson pid "$(<"$NODE_PID_FILE")" \
		'.nodes |= map(if .name == $name then .pid = $pid else . end)' \
		"$CLUSTER_DIR/cluster.json" >"$CLUSTER_DIR/cluster.json.new"
	mv "$CLUSTER_DIR/cluster.json.new" "$CLUSTER_DIR/cluster.json"
}

# wait_up CONTAINERD_LOG KUBELET_LOG: until containerd answers and the
# kubelet is healthy; dies naming the logs.
wait_up() {
	wait_for "containerd of node $n" 60 ctr --address "$(containerd_sock "$n")" version ||
		die "containerd of node $n did not start in 60s; see $1"
	wait_for "the kubelet of node $n" 120 kubelet_ok ||
		die "the kubelet of node $n was not healthy in 120s; see $2"
}

# --- reboot -----------------------------------------------------------------

# descendants PID...: every descendant of each PID.
descendants() {
	local p c
	for p in "$@"; do
		for c in $(pgrep -P "$p"); do
			echo "$c"
			descendants "$c"
		done
	done
}

# container_ids: the ids of node n's containers and sandboxes, from
# containerd's runtime state (gone once reboot has run).
container_ids() {
	find "$(node_dir "$n")/containerd/state/io.containerd.runtime.v2.task/k8s.io/" \
		-mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null || true
}

# container_cgroups: the cgroup directories (every hierarchy) of node n's
# containers: containerd names them /k8s.io/<id> (down.sh).
container_cgroups() {
	local mnt id
	for id in $(container_ids); do
		while read -r mnt; do
			[[ -d $mnt/k8s.io/$id ]] && echo "$mnt/k8s.io/$id"
		done < <(cgroup_mounts)
	done
}

# node_pids: every host process of node n: its node process and what
# runs under it, the holder, the shims serving its containerd, what runs
# under them, and anything left in its containers' cgroups.
node_pids() {
	local sock shims=() pid cg node=
	sock=$(containerd_sock "$n")
	# The recorded node process, unless it has ended (and its pid is
	# another process's now).
	if [[ -f $NODE_PID_FILE ]] && grep -qzE 'node(-daemons)?\.sh' "/proc/$(<"$NODE_PID_FILE")/cmdline" 2>/dev/null; then
		node=$(<"$NODE_PID_FILE")
	fi
	for pid in $(pgrep -f containerd-shim); do
		[[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == *" -address $sock "* ]] && shims+=("$pid")
	done
	{
		if [[ -n $node ]]; then
			echo "$node"
			descendants "$node"
		fi
		holder
		printf '%s\n' "${shims[@]}"
		descendants "${shims[@]}"
		for cg in $(container_cgroups); do cat "$cg/cgroup.procs" 2>/dev/null; done
	} | grep -v '^$' | sort -un
}

# alive PID: PID runs (a zombie has ended: init reaps it).
alive() {
	local state
	state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
	[[ -n $state && $state != Z ]]
}

# power_off: SIGKILL every process of node n, stopped first so that none
# forks or restarts another meanwhile; bounded by POWER_OFF_SECONDS.
POWER_OFF_SECONDS=30
power_off() {
	local pids pid i left
	for ((i = 0; i < POWER_OFF_SECONDS * 2; i++)); do
		mapfile -t pids < <(node_pids)
		left=()
		for pid in "${pids[@]}"; do alive "$pid" && left+=("$pid"); done
		((${#left[@]})) || return 0
		((i > 0)) || log "killing ${#left[@]} processes of node $n (daemons, shims, containers)"
		kill -STOP "${left[@]}" 2>/dev/null || true
		kill -KILL "${left[@]}" 2>/dev/null || true
		sleep 0.5
	done
	die "processes of node $n survived ${POWER_OFF_SECONDS}s of SIGKILL: ${left[*]}"
}

# store_mounts: the mounts strictly below node n's store as the host sees
# it (the volumes' overlays and any image mounts), deepest first.
store_mounts() {
	local root mp
	root=$(node_host_root "$n")
	while IFS= read -r mp; do
		[[ $mp == "$root"/* ]] && echo "$mp"
	done < <(mounts_under "$root")
	return 0
}

# unmount_store: what a reboot unmounts of the store, which is shared with
# the host: every mount below it; then the loop devices of its images.
unmount_store() {
	local pass mp mps file backing dev
	for ((pass = 0; pass < 5; pass++)); do
		mapfile -t mps < <(store_mounts)
		((${#mps[@]})) || break
		((pass > 0)) || log "unmounting ${#mps[@]} mounts below the store of node $n"
		for mp in "${mps[@]}"; do
			umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
		done
	done
	mapfile -t mps < <(store_mounts)
	if ((${#mps[@]})); then
		echo "error: mounts below the store of node $n left: ${mps[*]}" >&2
		return 1
	fi
	for file in /sys/block/loop*/loop/backing_file; do
		[[ -f $file ]] || continue
		backing=$(<"$file")
		[[ $backing == "$(node_store "$n")"/* || $backing == "$(node_host_root "$n")"/* ]] || continue
		dev=/dev/$(basename "$(dirname "$(dirname "$file")")")
		if ! losetup -d "$dev" 2>/dev/null; then
			echo "error: loop device $dev still holds $backing" >&2
			return 1
		fi
	done
}

# forget_runtime: what a real node keeps on tmpfs and loses in a reboot:
# containerd's state directory (shim sockets, netns mounts), runc's, and
# the containers' cgroups, emptied by power_off.
forget_runtime() {
	local cg dir
	dir=$(node_dir "$n")
	for cg in $(container_cgroups); do
		rmdir "$cg" 2>/dev/null || log "warning: cgroup $cg of a killed container could not be removed"
	done
	rm -rf "$dir/containerd/state" "$dir/runc"
}

reboot() {
	[[ -f $CLUSTER_DIR/cluster.json ]] || die "no node $n at $CLUSTER_DIR (no cluster.json); run make up"
	local at=$SECONDS
	local unmounted=true
	power_off
	rm -f "$HOLDER_PID_FILE"
	# A reboot that could not unmount everything still boots the node, so
	# that the tests after this one find it up; it fails at the end.
	unmount_store || unmounted=false
	forget_runtime
	log "node $n is off ($((SECONDS - at)) s); booting it"
	launch "node$n" unshare --mount --propagation unchanged "$CLUSTER_LIB/node.sh" "$n"
	record_node_pid
	wait_up "$LOG_DIR/node$n.log and $LOG_DIR/node$n-containerd.log" "$LOG_DIR/node$n-kubelet.log"
	log "node $n rebooted: containerd and the kubelet are up ($((SECONDS - at)) s)"
	$unmounted || die "node $n rebooted with mounts of its store left from before (see above): not a clean reboot"
}

# run: inside the node's namespace, as the node process: each daemon as
# recorded, appending to its log, then wait for them as node.sh does. A
# kubelet that exits within KUBELET_SETTLE seconds of its start (containerd
# still loading its containers: "server is not initialized yet") is
# started again, as systemd's Restart= does on a real node.
KUBELET_SETTLE=30
KUBELET_TRIES=10
start_daemon() {
	local name=$1 args envs cwd out
	mapfile -d '' args <"$SAVED_DIR/$name.cmdline"
	mapfile -d '' envs <"$SAVED_DIR/$name.environ"
	cwd=$(<"$SAVED_DIR/$name.cwd")
	out=$(<"$SAVED_DIR/$name.log")
	(cd "$cwd" && exec env -i "${envs[@]}" "${args[@]}") >>"$out" 2>&1 &
}
run() {
	local try started kubelet
	start_daemon containerd
	if ! wait_for "containerd of node $n" 60 ctr --address "$(containerd_sock "$n")" version; then
		echo "containerd of node $n did not start; see $(<"$SAVED_DIR/containerd.log")" >&2
		exit 1
	fi
	for ((try = 1; try <= KUBELET_TRIES; try++)); do
		start_daemon kubelet
		kubelet=$! started=$SECONDS
		wait "$kubelet" || true
		((SECONDS - started < KUBELET_SETTLE)) || break
		echo "$(date +%H:%M:%S) the kubelet of node $n exited $((SECONDS - started)) s after its start (try $try of $KUBELET_TRIES): starting it again" >&2
		sleep 2
	done
	wait
}

status() {
	local name rc=0
	for name in "${DAEMONS[@]}"; do
		if [[ -n $(daemon_pid "$name") ]]; then echo "$name: running (pid $(daemon_pid "$name"))"; else echo "$name: stopped"; rc=1; fi
	done
	if kubelet_ok >/dev/null 2>&1; then echo "kubelet healthz: ok"; else echo "kubelet healthz: not ok"; rc=1; fi
	return "$rc"
}

require_root
[[ -d $PID_DIR ]] || die "no cluster at $CLUSTER_DIR (no $PID_DIR); run make up"
case ${1:-} in
stop) stop ;;
start) start ;;
reboot) reboot ;;
status) status ;;
run) run ;;
*) die "usage: $0 stop|start|reboot|status|run NODE_NUMBER" ;;
esac
