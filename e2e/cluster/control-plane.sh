#!/usr/bin/env bash
# Stop and start the local cluster's etcd and kube-apiserver, as a
# control-plane outage (e2e/soak's apiserver fault, SOAK_FAULT=apiserver).
#
#   control-plane.sh stop    # TERM kube-apiserver, then etcd (KILL after 20 s each);
#                            # first records each one's command line, environment and
#                            # working directory from /proc
#   control-plane.sh start   # etcd, then kube-apiserver, with exactly what stop recorded,
#                            # through launch (same cgroup, same logs appended, new pid
#                            # files); returns once etcd is healthy and /readyz answers
#   control-plane.sh status  # exit 0 when both run and the API server is ready
#
# Both verbs are idempotent: stop leaves a stopped component alone, start
# a running one. The processes were started by up.sh's
# start_control_plane; re-running their recorded command lines instead of
# a copy of that function keeps them exactly as up.sh made them.
#
# LAYERCACHE_CLUSTER_DIR names the cluster's directory when it is not this
# checkout's _output/cluster (a test run from another worktree passes the
# directory of its KUBECONFIG).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -n ${LAYERCACHE_CLUSTER_DIR:-} ]]; then
	CLUSTER_DIR=$LAYERCACHE_CLUSTER_DIR
	LOG_DIR=$CLUSTER_DIR/logs
	PID_DIR=$CLUSTER_DIR/pids
	STATE_DIR=$CLUSTER_DIR/state
	PKI_DIR=$CLUSTER_DIR/pki
	KUBECONFIG_FILE=$CLUSTER_DIR/kubeconfig
	# That cluster's own kubectl, when its checkout built one.
	[[ ! -x $CLUSTER_DIR/../bin/kubectl ]] || KUBECTL=$(cd "$CLUSTER_DIR/../bin" && pwd)/kubectl
fi
SAVED_DIR=$STATE_DIR/control-plane
# Start order; stop goes the other way.
COMPONENTS=(etcd kube-apiserver)
STOP_SECONDS=20

# running NAME: the pid of NAME if its pid file names a live process that
# is NAME (a pid may have been reused), else nothing.
running() {
	local name=$1 f=$PID_DIR/$1.pid pid argv0
	[[ -f $f ]] || return 0
	pid=$(<"$f")
	[[ -r /proc/$pid/cmdline ]] || return 0
	argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -1)
	[[ $(basename "$argv0") == "$name" ]] && echo "$pid"
	return 0
}

stop_one() {
	local name=$1 pid
	pid=$(running "$name")
	if [[ -z $pid ]]; then
		log "$name is not running"
		return
	fi
	save_process "$SAVED_DIR" "$name" "$pid"
	log "stopping $name (pid $pid)"
	terminate "$name" "$pid" "$STOP_SECONDS"
}

etcd_ok() { curl -sf "http://127.0.0.1:$ETCD_CLIENT_PORT/health"; }
apiserver_ok() { kubectl get --raw /readyz; }

start_one() {
	local name=$1 args=() envs=() cwd
	if [[ -n $(running "$name") ]]; then
		log "$name is running"
	else
		[[ -s $SAVED_DIR/$name.cmdline ]] ||
			die "no recorded command line of $name in $SAVED_DIR: only what control-plane.sh stop stopped can be started (or run make up)"
		mapfile -d '' args <"$SAVED_DIR/$name.cmdline"
		mapfile -d '' envs <"$SAVED_DIR/$name.environ"
		cwd=$(<"$SAVED_DIR/$name.cwd")
		log "starting $name"
		cd "$cwd"
		launch "$name" env -i "${envs[@]}" "${args[@]}"
	fi
	case $name in
	etcd) wait_for etcd 60 etcd_ok || die "etcd did not become healthy in 60s; see $LOG_DIR/etcd.log" ;;
	kube-apiserver) wait_for kube-apiserver 180 apiserver_ok ||
		die "kube-apiserver did not become ready in 180s; see $LOG_DIR/kube-apiserver.log" ;;
	esac
}

status() {
	local name rc=0
	for name in "${COMPONENTS[@]}"; do
		if [[ -n $(running "$name") ]]; then echo "$name: running (pid $(running "$name"))"; else echo "$name: stopped"; rc=1; fi
	done
	if apiserver_ok >/dev/null 2>&1; then echo "readyz: ok"; else echo "readyz: not ready"; rc=1; fi
	return "$rc"
}

require_root
[[ -d $PID_DIR ]] || die "no cluster at $CLUSTER_DIR (no $PID_DIR); run make up"
case ${1:-} in
stop)
	for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_one "${COMPONENTS[i]}"; done
	;;
start)
	for name in "${COMPONENTS[@]}"; do start_one "$name"; done
	log "etcd and kube-apiserver are up"
	;;
status) status ;;
*) die "usage: $0 stop|start|status" ;;
esac
