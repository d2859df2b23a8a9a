# Shared by the e2e cluster scripts (sourced, not run).
#
# Layout (everything the cluster writes is under $CLUSTER_DIR, removed by
# down.sh; build outputs under $BIN_DIR and $IMAGES_DIR are kept as caches):
#   _output/bin/             kube-apiserver, kube-controller-manager,
#                            kube-scheduler, kubelet, kubectl (pinned build)
#   _output/images/          image archives and the binaries in them
#   _output/cluster/         kubeconfig, cluster.json, pki/, etcd/, logs/,
#                            pids/, state/ (what up.sh changed on the host),
#                            node<N>/ (containerd, kubelet, CNI, layercache),
#                            registry/ (registry.sh: config, credentials, blobs)

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER_LIB=$REPO_DIR/e2e/cluster
OUT_DIR=$REPO_DIR/_output
BIN_DIR=$OUT_DIR/bin
IMAGES_DIR=$OUT_DIR/images
CLUSTER_DIR=$OUT_DIR/cluster
LOG_DIR=$CLUSTER_DIR/logs
PID_DIR=$CLUSTER_DIR/pids
STATE_DIR=$CLUSTER_DIR/state
PKI_DIR=$CLUSTER_DIR/pki
KUBECONFIG_FILE=$CLUSTER_DIR/kubeconfig
# The pinned build; the kind backend, which does not build Kubernetes, falls
# back to the kubectl on PATH.
KUBECTL=$BIN_DIR/kubectl
if [[ ! -x $KUBECTL ]] && command -v kubectl >/dev/null; then KUBECTL=$(command -v kubectl); fi

# Every process the local cluster starts lives in this cgroup (in each v1
# hierarchy), and so do the containers: runc places them below the cgroup
# of containerd's shim. down.sh kills and removes the whole subtree.
CGROUP_NAME=layercache-e2e

# The node's store root, as the project's pods see it (docs/operating.md, "The node's store").
LAYERCACHE_ROOT=/var/lib/layercache
# Each node's kubelet directory (node_dir N/kubelet) is bind-mounted here in
# that node's mount namespace (node.sh).
KUBELET_ROOT=/var/lib/kubelet

APISERVER_PORT=6443
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
# The cluster's OCI registry (registry.sh; make up NODES=2 or --with
# registry): Debian's docker-registry on loopback, TLS with a certificate
# from the cluster's CA, htpasswd auth. Its port is none of the cluster's
# (6443, 10248-10280, 10257, 10259, 12379-12380) nor the node agent's
# (8080-8083) nor Tekton's (9443-9590).
REGISTRY_PORT=5443
REGISTRY_ADDRESS=127.0.0.1:$REGISTRY_PORT
REGISTRY_USER=layercache
# config.yml, htpasswd, password, docker/config.json, data/ (the blobs).
REGISTRY_DIR=$CLUSTER_DIR/registry
# What up.sh creates for it in layercache-system (e2e/README.md, "The registry").
REGISTRY_SECRET=layercache-registry
REGISTRY_BAD_SECRET=layercache-registry-bad
REGISTRY_STORAGECLASS=layercache-registry
REGISTRY_REPOSITORY=$REGISTRY_ADDRESS/caches

# Marks the lines up.sh adds to /etc/hosts.
HOSTS_MARK="# layercache-e2e"

IMAGE_LAYERCACHE=localhost/layercache:dev
IMAGE_BUSYBOX=localhost/busybox:e2e
IMAGE_PAUSE=localhost/pause:e2e

image_archives() { echo "$IMAGES_DIR/pause.tar" "$IMAGES_DIR/busybox.tar" "$IMAGES_DIR/layercache.tar"; }

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

require_root() {
	[[ $(id -u) == 0 ]] || die "the local cluster needs root (it runs a kubelet and containerd); run: sudo $0 $*"
}

node_name() { echo "layercache-node$1"; }
# Node N has an address of its own on the host's loopback device (from
# 198.18.0.0/15, the range RFC 2544 sets aside for tests; the kubelet
# refuses 127/8 as a node IP): the nodes share the host's network, and
# each hostNetwork pod of a DaemonSet (the node agents) binds its metrics
# and probe ports on its node's address (status.hostIP), as on separate
# machines. Traffic to it never leaves the host.
node_ip() { echo "198.18.0.$1"; }
node_dir() { echo "$CLUSTER_DIR/node$1"; }
kubelet_port() { echo $((10240 + 10 * $1)); }     # 10250, 10260, ...
kubelet_healthz_port() { echo $((10238 + 10 * $1)); } # 10248, 10258, ...
bridge_name() { echo "lce2e-br$1"; }
pod_cidr() { echo "10.244.$1.0/24"; }
containerd_sock() { echo "$(node_dir "$1")/containerd.sock"; }
# Node N keeps its store in node_store N. The host sees it at node_host_root
# N: node 1 at the host's own $LAYERCACHE_ROOT (a bind mount, as on a real
# node), the others at their store directory. Inside its own mount
# namespace every node sees its store at $LAYERCACHE_ROOT. Both are shared
# mounts in one peer group, so a volume the node agent mounts is visible on
# the host too.
node_store() { echo "$(node_dir "$1")/layercache"; }
node_host_root() {
	if [[ $1 == 1 ]]; then echo "$LAYERCACHE_ROOT"; else node_store "$1"; fi
}

kubectl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# cert NAME CN O EXTENSIONS: a P-256 key and a certificate signed by the CA.
cert() {
	local name=$1 cn=$2 o=$3 ext=$4 subj="/CN=$2"
	[[ -z $o ]] || subj="/O=$o/CN=$cn"
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI_DIR/$name.key" 2>/dev/null
	openssl req -new -key "$PKI_DIR/$name.key" -subj "$subj" -out "$PKI_DIR/$name.csr" 2>/dev/null
	printf '%s\n' "$ext" >"$PKI_DIR/$name.ext"
	openssl x509 -req -in "$PKI_DIR/$name.csr" -CA "$PKI_DIR/ca.crt" -CAkey "$PKI_DIR/ca.key" -CAcreateserial \
		-days 30 -extfile "$PKI_DIR/$name.ext" -out "$PKI_DIR/$name.crt" 2>/dev/null
	rm -f "$PKI_DIR/$name.csr" "$PKI_DIR/$name.ext"
}

# wait_for DESCRIPTION SECONDS COMMAND...: poll COMMAND once a second.
wait_for() {
	local what=$1 timeout=$2 i
	shift 2
	for ((i = 0; i < timeout; i++)); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 1
	done
	return 1
}

# --- host packages ----------------------------------------------------------

apt_updated=
apt_update_once() {
	[[ -n $apt_updated ]] && return
	log "apt-get update"
	apt-get update -qq
	apt_updated=1
}

# apt_install PKG...: install Debian packages without starting their
# services. containerd and etcd-server would start system-wide daemons; the
# local cluster and the envtest suite run their own, so the package scripts
# are kept from starting any.
apt_install() {
	(($#)) || return 0
	log "installing $*"
	apt_update_once
	local policy=/usr/sbin/policy-rc.d made_policy=
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		made_policy=1
	fi
	local rc=0
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
	[[ -z $made_policy ]] || rm -f "$policy"
	return "$rc"
}

# missing_cluster_packages prints, one a line, the Debian packages of the
# local cluster that this host lacks (up.sh; host-packages.sh installs them
# with make test's others).
missing_cluster_packages() {
	command -v containerd >/dev/null || echo containerd
	command -v runc >/dev/null || echo runc
	[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || echo containernetworking-plugins
	command -v etcd >/dev/null || echo etcd-server
	# mkfs.btrfs goes into the layercache image (hack/imagebuild/with-libs.sh).
	command -v mkfs.btrfs >/dev/null || echo btrfs-progs
}

# install_etcd makes sure Debian's etcd is at /usr/bin/etcd: the local
# cluster's etcd and the envtest suite's.
install_etcd() {
	command -v etcd >/dev/null || apt_install etcd-server
}

# cgroup_mounts prints the mount point of every cgroup hierarchy.
cgroup_mounts() {
	awk '{ for (i = 7; $i != "-"; i++) ; if ($(i+1) == "cgroup" || $(i+1) == "cgroup2") print $5 }' /proc/self/mountinfo
}

# cgroup_join PID: move PID into $CGROUP_NAME in every hierarchy.
cgroup_join() {
	local pid=$1 mnt dir
	while read -r mnt; do
		dir=$mnt/$CGROUP_NAME
		mkdir -p "$dir"
		# A new cpuset cgroup starts with no CPUs and cannot take tasks.
		if [[ -f $dir/cpuset.cpus && -z $(<"$dir/cpuset.cpus") ]]; then
			cat "$mnt/cpuset.cpus" >"$dir/cpuset.cpus"
			cat "$mnt/cpuset.mems" >"$dir/cpuset.mems"
		fi
		echo "$pid" >"$dir/cgroup.procs"
	done < <(cgroup_mounts)
}

# cgroup_pids prints every process in the cluster's cgroup subtree.
cgroup_pids() {
	local mnt
	while read -r mnt; do
		[[ -d $mnt/$CGROUP_NAME ]] || continue
		find "$mnt/$CGROUP_NAME" -name cgroup.procs -exec cat {} + 2>/dev/null
	done < <(cgroup_mounts) | sort -un
}

# launch NAME COMMAND...: start COMMAND as a daemon that outlives this
# script, in the cluster's cgroup, in its own session, logging to
# $LOG_DIR/NAME.log; its pid goes to $PID_DIR/NAME.pid.
launch() {
	local name=$1
	shift
	(
		cgroup_join "$BASHPID"
		exec setsid "$@"
	) >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
	echo $! >"$PID_DIR/$name.pid"
}

pid_alive() {
	local f=$PID_DIR/$1.pid
	[[ -f $f ]] && kill -0 "$(<"$f")" 2>/dev/null
}

# mounts_under PREFIX...: mount points at or below any PREFIX, or whose
# source (bind mounts) or overlay options point into one, deepest first.
# save_process DIR NAME PID records in DIR what it takes to run process
# PID again as it was (control-plane.sh, node-daemons.sh): its command
# line, environment, directory and where its output went.
save_process() {
	local dir=$1 name=$2 pid=$3
	mkdir -p "$dir"
	cat "/proc/$pid/cmdline" >"$dir/$name.cmdline"
	cat "/proc/$pid/environ" >"$dir/$name.environ"
	readlink "/proc/$pid/cwd" >"$dir/$name.cwd"
	readlink "/proc/$pid/fd/1" >"$dir/$name.log"
}

# terminate NAME PID SECONDS: TERM, then KILL after SECONDS; dies if the
# process survives KILL.
terminate() {
	local name=$1 pid=$2 seconds=$3 i
	kill -TERM "$pid"
	for ((i = 0; i < seconds * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	log "$name did not stop in ${seconds}s: KILL"
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	die "$name (pid $pid) survived KILL"
}

mounts_under() {
	awk -v prefixes="$*" '
	function decode(s) { gsub(/\\040/, " ", s); gsub(/\\011/, "\t", s); gsub(/\\012/, "\n", s); gsub(/\\134/, "\\", s); return s }
	function within(p, pre) { return p == pre || index(p, pre "/") == 1 }
	BEGIN { n = split(prefixes, pre, " ") }
	{
		mp = decode($5); root = decode($4)
		for (i = 7; $i != "-"; i++) ;
		opts = $(i + 3)
		for (j = 1; j <= n; j++) {
			if (within(mp, pre[j]) || within(root, pre[j]) || index(opts, pre[j] "/") > 0) { print length(mp) "\t" mp; break }
		}
	}' /proc/self/mountinfo | sort -rn -k1,1 | cut -f2- | uniq
}

# --- optional CI systems (tekton.sh, argo.sh) -------------------------------

# tools_version TOOLS_DIR MODULE prints the version of MODULE that the tools
# module TOOLS_DIR requires.
tools_version() {
	local v
	v=$(awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2 }' "$1/go.mod")
	[[ -n $v ]] || die "$1/go.mod does not require $2"
	echo "$v"
}

# require_local_cluster PART WITH: a running cluster of the local backend,
# which PART's manifests are made for (no kube-proxy, no pod routes); WITH
# is the make up argument that installs it. Sets NODE_COUNT.
require_local_cluster() {
	local part=$1 with=$2 json=$CLUSTER_DIR/cluster.json
	require_root
	[[ -f $KUBECONFIG_FILE && -f $json ]] ||
		die "no cluster: $KUBECONFIG_FILE or $json is missing; run make up WITH=$with"
	[[ $(jq -r .backend "$json") == local ]] ||
		die "$part is installed on the local backend only (CLUSTER=local): its manifests are made for a cluster without kube-proxy"
	kubectl get --raw /readyz >/dev/null 2>&1 || die "the cluster's API server is not ready; run make up"
	NODE_COUNT=$(jq '.nodes | length' "$json")
}

# build_only ARGS...: whether a part's script (tekton.sh, argo.sh,
# buildkit.sh) was asked only to build its binaries and images. make
# e2e-build builds every part that way, before any cluster exists, while
# make test's unit stages run beside it.
build_only() {
	case ${1:-} in
	--build-only) return 0 ;;
	"") return 1 ;;
	*) die "unknown argument $1 (usage: $(basename "$0") [--build-only])" ;;
	esac
}

# tools_stamp TOOLS_DIR SCRIPT prints what a build of TOOLS_DIR's commands
# depends on: its go.mod and go.sum, the installing script and the Go
# version.
tools_stamp() {
	(cat "$1/go.mod" "$1/go.sum" "$2"; go version) | sha256sum | cut -d' ' -f1
}

# tools_built STAMP BIN_DIR IMAGES_DIR COMMAND...: whether every command's
# binary and image archive exist and were built from STAMP
# (BIN_DIR/.stamp), so that even the link step can be skipped.
tools_built() {
	local stamp=$1 bin=$2 images=$3 c
	shift 3
	for c in "$@"; do
		[[ -x $bin/$c && -f $images/$c.tar ]] || return 1
	done
	[[ -f $bin/.stamp && $(<"$bin/.stamp") == "$stamp" ]]
}
