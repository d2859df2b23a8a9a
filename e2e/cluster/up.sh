#!/usr/bin/env bash
# Start the e2e cluster and deploy layercache into it.
#
#   up.sh [--nodes N] [--backend local|kind] [--with "tekton argo buildkit registry"]
#         [--deploy kpt|kubectl|helm] [--build-only]
#
# local (default, what CI runs): a real cluster on this machine, as root,
# from source-built Kubernetes binaries, Debian's containerd and etcd, and
# images built without Docker. Running it again keeps a healthy cluster and
# only rebuilds, reloads and redeploys the project. down.sh removes it all.
# kind: the same images in a kind cluster, for machines with a Docker engine.
# --with installs optional parts (space- or comma-separated): tekton
# (e2e/cluster/tekton.sh), argo (e2e/cluster/argo.sh), buildkit (BuildKit's
# image for e2e/imagebuild, e2e/cluster/buildkit.sh), registry
# (e2e/cluster/registry.sh, with its Secrets and StorageClass; always there
# with two nodes or more). All on the local backend only.
# --deploy: kpt live apply (make deploy's path, the default), kubectl apply
# -k, which spares the quick start building kpt (about 3 minutes of a cold
# 2-core machine), or helm upgrade --install of charts/layercache with the
# values that mirror config/e2e (make e2e's path: every e2e package runs on
# a Helm install).
# --build-only (local backend): build what that cluster needs (Kubernetes,
# the images, kpt, the --with parts) and start nothing; make e2e-build,
# which make test runs beside its unit stages.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODES=1
BACKEND=local
WITH=
DEPLOY=kpt
BUILD_ONLY=
while (($#)); do
	case $1 in
	--nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
	--nodes=*) NODES=${1#*=}; shift ;;
	--backend) BACKEND=${2:?--backend needs local or kind}; shift 2 ;;
	--backend=*) BACKEND=${1#*=}; shift ;;
	--with) WITH+=" ${2?--with needs a list of parts, e.g. tekton,registry}"; shift 2 ;;
	--with=*) WITH+=" ${1#*=}"; shift ;;
	--deploy) DEPLOY=${2:?--deploy needs kpt, kubectl or helm}; shift 2 ;;
	--deploy=*) DEPLOY=${1#*=}; shift ;;
	--build-only) BUILD_ONLY=1; shift ;;
	-h | --help) sed -n '2,24p' "$0"; exit 0 ;;
	*) die "unknown argument $1 (usage: up.sh [--nodes N] [--backend local|kind] [--with \"tekton argo buildkit registry\"] [--deploy kpt|kubectl|helm] [--build-only])" ;;
	esac
done
[[ $DEPLOY == kpt || $DEPLOY == kubectl || $DEPLOY == helm ]] || die "--deploy $DEPLOY: want kpt, kubectl or helm"
[[ $NODES =~ ^[1-4]$ ]] || die "--nodes $NODES: want 1 to 4"
[[ $BACKEND == local || $BACKEND == kind ]] || die "--backend $BACKEND: want local or kind"
WITH_TEKTON=
WITH_ARGO=
WITH_BUILDKIT=
# The multi-node scenarios (e2e/multinode) move caches between nodes through it.
WITH_REGISTRY=
((NODES < 2)) || WITH_REGISTRY=1
for part in ${WITH//,/ }; do
	case $part in
	tekton) WITH_TEKTON=1 ;;
	argo) WITH_ARGO=1 ;;
	buildkit) WITH_BUILDKIT=1 ;;
	registry) WITH_REGISTRY=1 ;;
	*) die "--with $part: the optional parts are: tekton, argo, buildkit, registry" ;;
	esac
done
if [[ -n $WITH_TEKTON$WITH_ARGO$WITH_BUILDKIT && $BACKEND != local ]]; then
	log "warning: --with $WITH: Tekton, Argo Workflows and BuildKit are installed on the local backend only; the e2e/tekton, e2e/argo and e2e/imagebuild scenarios will fail"
	WITH_TEKTON= WITH_ARGO= WITH_BUILDKIT=
fi
if [[ -n $WITH_REGISTRY && $BACKEND != local ]]; then
	# kind's nodes are containers: the host's 127.0.0.1 is not theirs.
	log "warning: the registry runs on the local backend only; the e2e/multinode scenarios will fail"
	WITH_REGISTRY=
fi

start=$SECONDS

# --- host packages ----------------------------------------------------------

install_packages() {
	local missing
	mapfile -t missing < <(missing_cluster_packages)
	apt_install "${missing[@]}"
}

busybox_binary() {
	local dir=$IMAGES_DIR/busybox-static
	if [[ ! -x $dir/bin/busybox ]]; then
		log "fetching Debian's busybox-static"
		apt-cache show busybox-static >/dev/null 2>&1 || apt_update_once
		rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
		(cd "$dir.tmp" && apt-get download -qq busybox-static >/dev/null && dpkg-deb -x busybox-static_*.deb root)
		rm -rf "$dir" && mv "$dir.tmp/root" "$dir" && rm -rf "$dir.tmp"
	fi
	echo "$dir/bin/busybox"
}

# --- binaries and images ----------------------------------------------------

build_kubernetes() {
	"$CLUSTER_LIB/build-kubernetes.sh"
}

# compile_images builds the binaries the images hold, and buildimage. One
# go build, without cgo for all four, so their shared packages compile once.
compile_images() {
	local work=$IMAGES_DIR/bin
	mkdir -p "$work"
	log "building layercache's binaries"
	(cd "$REPO_DIR" && CGO_ENABLED=0 go build -o "$work/" ./cmd/layercache ./cmd/layerfs \
		./hack/imagebuild/cmd/pause ./hack/imagebuild/cmd/buildimage)
}

# assemble_images writes the image archives from compile_images' binaries
# and busybox_binary's busybox.
assemble_images() {
	local work=$IMAGES_DIR/bin busybox
	busybox=$(busybox_binary)
	local libs mkfs
	libs=$("$REPO_DIR/hack/imagebuild/with-libs.sh" mkfs.btrfs)
	mapfile -t mkfs <<<"$libs"
	"$work/buildimage" -o "$IMAGES_DIR/layercache.tar" --ref "$IMAGE_LAYERCACHE" \
		--file "$work/layercache:/layercache" --file "$work/layerfs:/layerfs" "${mkfs[@]}" \
		--env PATH=/usr/sbin:/usr/bin --entrypoint /layercache >/dev/null
	"$work/buildimage" -o "$IMAGES_DIR/busybox.tar" --ref "$IMAGE_BUSYBOX" --busybox "$busybox" --tmpdir /tmp \
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/sh >/dev/null
	"$work/buildimage" -o "$IMAGES_DIR/pause.tar" --ref "$IMAGE_PAUSE" --file "$work/pause:/pause" --entrypoint /pause >/dev/null
}

build_images() {
	compile_images
	assemble_images
}

# host_packages installs the cluster's Debian packages and fetches busybox:
# apt, one process at a time.
host_packages() {
	install_packages
	busybox_binary >/dev/null
}

# side_by_side FUNCTION...: runs each function in the background and waits
# for all; fails naming those that failed (their errors are above). The
# downloads overlap the compiles, and on 2 cores each compile fills the
# other's serial stretches (links, the largest packages).
side_by_side() {
	local f i pids=() failed=()
	for f in "$@"; do
		"$f" &
		pids+=("$!")
	done
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}" || failed+=("${@:i+1:1}")
	done
	((${#failed[@]} == 0)) || die "failed: ${failed[*]} (errors above)"
}

# build_cluster: the binaries and images every local cluster runs.
build_cluster() {
	side_by_side host_packages build_kubernetes compile_images
	assemble_images
}

# build_local_only: what up_local and the --with parts build, and kpt or
# helm for --deploy kpt or helm; nothing starts.
build_local_only() {
	require_root
	build_cluster
	[[ $DEPLOY != kpt ]] || make -s -C "$REPO_DIR" "$REPO_DIR/bin/kpt" >/dev/null
	[[ $DEPLOY != helm ]] || make -s -C "$REPO_DIR" "$REPO_DIR/bin/helm" >/dev/null
	[[ -z $WITH_TEKTON ]] || "$CLUSTER_LIB/tekton.sh" --build-only
	[[ -z $WITH_ARGO ]] || "$CLUSTER_LIB/argo.sh" --build-only
	[[ -z $WITH_BUILDKIT ]] || "$CLUSTER_LIB/buildkit.sh" --build-only
	[[ -z $WITH_REGISTRY ]] || "$CLUSTER_LIB/registry.sh" install
	log "built for a local cluster in $((SECONDS - start))s"
}

# --- certificates and kubeconfigs -------------------------------------------

make_pki() {
	mkdir -p "$PKI_DIR"
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI_DIR/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$PKI_DIR/ca.key" -subj "/CN=layercache-e2e-ca" -days 30 \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
		-out "$PKI_DIR/ca.crt" 2>/dev/null
	local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
	cert apiserver kube-apiserver "" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert admin kubernetes-admin system:masters "$client"
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "$client"
	cert controller-manager system:kube-controller-manager "" "$client"
	cert scheduler system:kube-scheduler "" "$client"
	local n name
	for ((n = 1; n <= NODES; n++)); do
		name=$(node_name "$n")
		cert "kubelet$n-client" "system:node:$name" system:nodes "$client"
		cert "kubelet$n-serving" "$name" "" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$name,IP:$(node_ip "$n")"
	done
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI_DIR/sa.key" 2>/dev/null
	openssl ec -in "$PKI_DIR/sa.key" -pubout -out "$PKI_DIR/sa.pub" 2>/dev/null
	chmod 600 "$PKI_DIR"/*.key
}

# kubeconfig FILE CERTNAME: a self-contained kubeconfig for one identity.
kubeconfig() {
	local file=$1 id=$2
	cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: layercache-e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$PKI_DIR/ca.crt")
users:
- name: $id
  user:
    client-certificate-data: $(base64 -w0 "$PKI_DIR/$id.crt")
    client-key-data: $(base64 -w0 "$PKI_DIR/$id.key")
contexts:
- name: layercache-e2e
  context:
    cluster: layercache-e2e
    user: $id
current-context: layercache-e2e
EOF
	chmod 600 "$file"
}

# --- control plane ----------------------------------------------------------

# check_ports_free fails early, naming the holder, when a port the cluster
# listens on is taken (e.g. by another test's etcd or apiserver).
check_ports_free() {
	local p n used ports=("$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" 10257 10259)
	for ((n = 1; n <= NODES; n++)); do ports+=("$(kubelet_port "$n")" "$(kubelet_healthz_port "$n")"); done
	[[ -z $WITH_REGISTRY ]] || ports+=("$REGISTRY_PORT")
	for p in "${ports[@]}"; do
		used=$(ss -Hltnp "sport = :$p" 2>/dev/null)
		[[ -z $used ]] || die "port $p is in use, the cluster needs it: $used"
	done
}

start_control_plane() {
	log "starting etcd and the control plane"
	launch etcd etcd --name e2e --data-dir "$CLUSTER_DIR/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER_PORT"
	etcd_ok() { pid_alive etcd && curl -sf "http://127.0.0.1:$ETCD_CLIENT_PORT/health"; }
	wait_for etcd 60 etcd_ok || die "etcd did not become healthy; see $LOG_DIR/etcd.log"

	# Loopback only: the apiserver advertises 127.0.0.1 and reaches kubelets
	# by node name, which /etc/hosts resolves to the node's address on the
	# loopback device (node_ip). The kubernetes
	# Service gets no endpoints (loopback is not a valid endpoint), so
	# in-cluster clients use hostNetwork and KUBERNETES_SERVICE_HOST.
	#
	# WatchList=false: Debian's etcd (3.4.23) cannot serve watch-list
	# streams (no RequestWatchProgress before etcd 3.4.31), and with the
	# gate on (the default since 1.34) the API server turns every watch
	# from resourceVersion "" or "0" into such a stream
	# (SetListOptionsDefaults) and then refuses it on this etcd. A client
	# whose informers list without a resourceVersion, as Argo Workflows'
	# controller does, fails every watch and sees changes only when it
	# relists, up to a minute later. Off, those watches start as they did
	# before 1.34; clients that ask for a stream fall back to a list.
	#
	# PodNodeSelector: the e2e framework keeps a one-node scenario's pods
	# on node 1 of a two-node cluster with its namespace's node selector
	# (scheduler.alpha.kubernetes.io/node-selector), the pods of Tekton
	# and Argo included, so that one-node and two-node scenarios share a
	# cluster.
	launch kube-apiserver "$BIN_DIR/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--bind-address 127.0.0.1 --secure-port "$APISERVER_PORT" --advertise-address 127.0.0.1 \
		--endpoint-reconciler-type none \
		--tls-cert-file "$PKI_DIR/apiserver.crt" --tls-private-key-file "$PKI_DIR/apiserver.key" \
		--client-ca-file "$PKI_DIR/ca.crt" \
		--kubelet-client-certificate "$PKI_DIR/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$PKI_DIR/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$PKI_DIR/ca.crt" \
		--kubelet-preferred-address-types Hostname \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$PKI_DIR/sa.pub" \
		--service-account-signing-key-file "$PKI_DIR/sa.key" \
		--service-cluster-ip-range 10.96.0.0/16 \
		--authorization-mode Node,RBAC \
		--enable-admission-plugins NodeRestriction,PodNodeSelector \
		--allow-privileged \
		--feature-gates WatchList=false \
		--profiling=false
	apiserver_ok() { pid_alive kube-apiserver && kubectl get --raw /readyz; }
	wait_for kube-apiserver 180 apiserver_ok ||
		die "kube-apiserver did not become ready; see $LOG_DIR/kube-apiserver.log"

	kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" controller-manager
	kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" scheduler
	local cm=$CLUSTER_DIR/controller-manager.kubeconfig sched=$CLUSTER_DIR/scheduler.kubeconfig
	launch kube-controller-manager "$BIN_DIR/kube-controller-manager" \
		--kubeconfig "$cm" --authentication-kubeconfig "$cm" --authorization-kubeconfig "$cm" \
		--bind-address 127.0.0.1 \
		--service-account-private-key-file "$PKI_DIR/sa.key" --root-ca-file "$PKI_DIR/ca.crt" \
		--use-service-account-credentials \
		--service-cluster-ip-range 10.96.0.0/16 \
		--leader-elect=false --profiling=false
	launch kube-scheduler "$BIN_DIR/kube-scheduler" \
		--kubeconfig "$sched" --authentication-kubeconfig "$sched" --authorization-kubeconfig "$sched" \
		--bind-address 127.0.0.1 --leader-elect=false --profiling=false
}

# --- nodes ------------------------------------------------------------------

# The kubelet tunes these host-wide sysctls on start; down.sh puts them back.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

prepare_host() {
	local n name ip
	if [[ ! -f $STATE_DIR/sysctl ]]; then
		for name in "${KUBELET_SYSCTLS[@]}"; do echo "$name=$(sysctl -n "$name")"; done >"$STATE_DIR/sysctl"
	fi
	for ((n = 1; n <= NODES; n++)); do
		name=$(node_name "$n") ip=$(node_ip "$n")
		ip address replace "$ip/32" dev lo
		if ! grep -qE "^${ip//./\\.}[[:space:]]+$name([[:space:]]|\$)" /etc/hosts; then
			# Appended in place: /etc/hosts may be a bind mount that a rename would break.
			[[ -z $(tail -c1 /etc/hosts) ]] || echo >>/etc/hosts
			echo "$ip $name $HOSTS_MARK" >>/etc/hosts
		fi
	done
	# containerd puts containers in cgroups /k8s.io/<id>.
	if [[ ! -d /sys/fs/cgroup/pids/k8s.io ]]; then
		touch "$STATE_DIR/created-cgroup-k8s.io"
	fi
	if [[ ! -d /run/containerd ]]; then
		mkdir -p /run/containerd
		touch "$STATE_DIR/created-run-containerd"
	fi
	if [[ ! -d $KUBELET_ROOT ]]; then
		mkdir -p "$KUBELET_ROOT"
		touch "$STATE_DIR/created-kubelet-root"
	fi
	if [[ ! -d $LAYERCACHE_ROOT ]]; then
		mkdir -p "$LAYERCACHE_ROOT"
		touch "$STATE_DIR/created-layercache-root"
	fi
	# Bidirectional mount propagation (the node agent mounts volumes for the
	# kubelet) needs each store to be a shared mount.
	local store host
	for ((n = 1; n <= NODES; n++)); do
		store=$(node_store "$n") host=$(node_host_root "$n")
		mkdir -p "$store"
		mount --bind "$store" "$host"
		mount --make-rshared "$host"
	done
	touch "$STATE_DIR/mounted-layercache-root"
}

write_node_config() {
	local n=$1 dir name sock
	dir=$(node_dir "$n") name=$(node_name "$n") sock=$(containerd_sock "$n")
	((${#sock} < 100)) || die "containerd socket path $sock is too long for a unix socket; clone the repository to a shorter path"
	mkdir -p "$dir/containerd" "$dir/kubelet" "$dir/cni/net.d" "$dir/pod-logs"
	kubeconfig "$dir/kubelet.kubeconfig" "kubelet$n-client"

	cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "$sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$IMAGE_PAUSE"
  # runc cannot lower its oom_score_adj on this kind of host.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$dir/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
    max_conf_num = 1
EOF

	# Pods get an address on a private bridge and no route off it: nothing
	# in a pod can send traffic beyond its node's pods.
	cat >"$dir/cni/net.d/10-layercache-e2e.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "layercache-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(bridge_name "$n")",
      "isGateway": false,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(pod_cidr "$n")"}]],
        "dataDir": "$dir/cni/ipam"
      }
    }
  ]
}
EOF

	cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$n")
port: $(kubelet_port "$n")
healthzBindAddress: 127.0.0.1
healthzPort: $(kubelet_healthz_port "$n")
readOnlyPort: 0
tlsCertFile: $PKI_DIR/kubelet$n-serving.crt
tlsPrivateKeyFile: $PKI_DIR/kubelet$n-serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI_DIR/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$sock
imageServiceEndpoint: unix://$sock
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
podLogsDir: $dir/pod-logs
# No host resolver in pods: nothing in them may resolve or reach other
# hosts. The cluster DNS address is loopback, where nothing answers; it only
# spares every pod a MissingClusterDNS event.
resolvConf: ""
clusterDNS: [127.0.0.1]
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
serializeImagePulls: false
EOF
}

start_nodes() {
	local n
	for ((n = 1; n <= NODES; n++)); do
		write_node_config "$n"
		log "starting node $(node_name "$n")"
		launch "node$n" unshare --mount --propagation unchanged "$CLUSTER_LIB/node.sh" "$n"
	done
	for ((n = 1; n <= NODES; n++)); do
		wait_for "containerd of node $n" 60 ctr --address "$(containerd_sock "$n")" version ||
			die "containerd of node $n did not start; see $LOG_DIR/node$n.log and $LOG_DIR/node$n-containerd.log"
	done
}

load_images() {
	local n archive
	for ((n = 1; n <= NODES; n++)); do
		for archive in $(image_archives); do
			ctr --address "$(containerd_sock "$n")" -n k8s.io images import "$archive" >/dev/null ||
				die "importing $archive into node $n failed"
		done
	done
	log "images loaded: $IMAGE_LAYERCACHE $IMAGE_BUSYBOX $IMAGE_PAUSE"
}

write_cluster_info() {
	local n nodes=() registry=null
	for ((n = 1; n <= NODES; n++)); do
		nodes+=("$(jq -n --arg name "$(node_name "$n")" --arg root "$(node_host_root "$n")" \
			--argjson pid "$(<"$PID_DIR/node$n.pid")" --argjson port "$(kubelet_port "$n")" \
			'{name: $name, hostRoot: $root, pid: $pid, kubeletPort: $port}')")
	done
	[[ -z $WITH_REGISTRY ]] || registry=$(registry_info)
	printf '%s\n' "${nodes[@]}" | jq -s --arg kc "$KUBECONFIG_FILE" --argjson registry "$registry" \
		'{backend: "local", kubeconfig: $kc, nodes: .} + if $registry then {registry: $registry} else {} end' \
		>"$CLUSTER_DIR/cluster.json"
}

# --- registry ---------------------------------------------------------------

# registry_info: the registry's entry in cluster.json (e2e/framework's
# Registry; e2e/README.md, "The registry").
registry_info() {
	jq -n --arg address "$REGISTRY_ADDRESS" --arg repository "$REGISTRY_REPOSITORY" \
		--arg caFile "$PKI_DIR/ca.crt" --arg username "$REGISTRY_USER" --arg password "$(<"$REGISTRY_DIR/password")" \
		--arg dockerConfig "$REGISTRY_DIR/docker/config.json" --arg secret "$REGISTRY_SECRET" \
		--arg badSecret "$REGISTRY_BAD_SECRET" --arg storageClass "$REGISTRY_STORAGECLASS" \
		--arg storage "$REGISTRY_DIR/data" --arg log "$LOG_DIR/registry.log" --arg script "$CLUSTER_LIB/registry.sh" \
		'$ARGS.named'
}

# start_registry starts the registry or, on a cluster kept from a run that
# asked for it and with this run not asking, stops it and removes its files.
start_registry() {
	if [[ -n $WITH_REGISTRY ]]; then
		"$CLUSTER_LIB/registry.sh" start
	elif [[ -d $REGISTRY_DIR ]]; then
		log "removing the registry (not asked for)"
		"$CLUSTER_LIB/registry.sh" stop
		rm -rf "$REGISTRY_DIR"
	fi
}

# registry_objects makes what the node agents read to reach the registry,
# in their namespace: a docker config Secret with the CA beside it, the
# same with a wrong password, and a StorageClass whose claims' caches go
# through the registry. Without the registry, it removes them.
registry_objects() {
	local ns=layercache-system
	if [[ -z $WITH_REGISTRY ]]; then
		kubectl -n "$ns" delete secret "$REGISTRY_SECRET" "$REGISTRY_BAD_SECRET" --ignore-not-found >/dev/null
		kubectl delete storageclass "$REGISTRY_STORAGECLASS" --ignore-not-found >/dev/null
		return
	fi
	log "creating Secrets $REGISTRY_SECRET and $REGISTRY_BAD_SECRET, StorageClass $REGISTRY_STORAGECLASS"
	registry_secret "$ns" "$REGISTRY_SECRET" <"$REGISTRY_DIR/docker/config.json"
	jq -n --arg registry "$REGISTRY_ADDRESS" --arg user "$REGISTRY_USER" --arg password "wrong-$(<"$REGISTRY_DIR/password")" \
		'{auths: {($registry): {username: $user, password: $password, auth: ("\($user):\($password)" | @base64)}}}' |
		registry_secret "$ns" "$REGISTRY_BAD_SECRET"

	local class
	class=$(
		cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $REGISTRY_STORAGECLASS
  labels:
    app.kubernetes.io/name: layercache
provisioner: layercache.dev/node
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
allowVolumeExpansion: false
parameters:
  registry: $REGISTRY_REPOSITORY
  registrySecret: $REGISTRY_SECRET
EOF
	)
	# A StorageClass's parameters cannot change: a class an earlier version
	# of this script made differently is replaced.
	if ! kubectl apply --server-side --force-conflicts -f - <<<"$class" >/dev/null 2>&1; then
		kubectl delete storageclass "$REGISTRY_STORAGECLASS" --ignore-not-found >/dev/null
		kubectl apply --server-side --force-conflicts -f - <<<"$class" >/dev/null
	fi
}

# registry_secret NAMESPACE NAME: a kubernetes.io/dockerconfigjson Secret of
# the docker config on standard input, with the cluster's CA as ca.crt.
registry_secret() {
	local ns=$1 name=$2
	kubectl -n "$ns" create secret generic "$name" --type kubernetes.io/dockerconfigjson \
		--from-file .dockerconfigjson=/dev/stdin --from-file ca.crt="$PKI_DIR/ca.crt" \
		--dry-run=client -o yaml |
		kubectl apply --server-side --force-conflicts -f - >/dev/null
}

wait_nodes_ready() {
	log "waiting for $NODES node(s) to be Ready"
	nodes_registered() { [[ $(kubectl get nodes -o name | wc -l) -ge $NODES ]]; }
	wait_for nodes 120 nodes_registered || die "the kubelet did not register; see $LOG_DIR/node*-kubelet.log"
	kubectl wait --for=condition=Ready nodes --all --timeout=180s >/dev/null ||
		die "nodes not Ready; see $LOG_DIR/node*-kubelet.log and: kubectl describe nodes"
	wait_for "default service account" 60 kubectl -n default get serviceaccount default ||
		die "the default ServiceAccount did not appear; see $LOG_DIR/kube-controller-manager.log"
}

# running_cluster_ok: the cluster from an earlier up.sh is complete, healthy
# and has the node count asked for.
running_cluster_ok() {
	[[ -f $CLUSTER_DIR/cluster.json ]] || return 1
	[[ $(jq '.nodes | length' "$CLUSTER_DIR/cluster.json") == "$NODES" ]] || return 1
	local p
	for p in etcd kube-apiserver kube-controller-manager kube-scheduler; do pid_alive "$p" || return 1; done
	for ((p = 1; p <= NODES; p++)); do
		pid_alive "node$p" || return 1
		ctr --address "$(containerd_sock "$p")" version >/dev/null 2>&1 || return 1
	done
	kubectl get --raw /readyz >/dev/null 2>&1
}

up_local() {
	require_root
	[[ -d /sys/fs/cgroup/pids || -d /sys/fs/cgroup/memory ]] ||
		die "the local cluster needs cgroup v1 hierarchies (this host has cgroup v2 only); use --backend kind"
	build_cluster

	if running_cluster_ok; then
		log "cluster already running; reloading images"
	else
		log "no healthy $NODES-node cluster running: starting one"
		# Whatever an earlier, broken or differently sized cluster left.
		"$CLUSTER_LIB/down.sh" >/dev/null
		check_ports_free
		mkdir -p "$LOG_DIR" "$PID_DIR" "$STATE_DIR"
		make_pki
		kubeconfig "$KUBECONFIG_FILE" admin
		start_control_plane
		prepare_host
		start_nodes
	fi
	load_images
	start_registry
	write_cluster_info
	wait_nodes_ready
}

# apply_config OVERLAY applies config/OVERLAY as --deploy says. kpt, as make
# deploy uses it, tests the deploy package's real path (built once from
# hack/tools/kpt); a later kpt apply adopts what kubectl applied. helm
# installs charts/layercache with the values that mirror the overlay
# (charts/layercache/ci/OVERLAY-values.yaml; charts/chart_test.go checks
# they render the same objects) and takes over what kpt or kubectl applied.
apply_config() {
	local overlay=$1
	case $DEPLOY in
	kubectl)
		kubectl apply --server-side --force-conflicts -k "$REPO_DIR/config/$overlay"
		return
		;;
	helm)
		helm_install "$overlay"
		return
		;;
	esac
	make -s -C "$REPO_DIR" "$REPO_DIR/bin/kpt" >/dev/null
	KPT=$REPO_DIR/bin/kpt KUBECTL=$KUBECTL KUBECONFIG=$KUBECONFIG_FILE DEPLOY_TIMEOUT=3m \
		"$REPO_DIR/hack/deploy.sh" "$overlay"
}

# helm_install OVERLAY: helm upgrade --install of the chart, the e2e
# overlay's values for e2e. The chart leaves out the Namespace, which holds
# the release and must exist first: the package's, with its pod security
# label (the node agent is privileged).
helm_install() {
	local overlay=$1 values=()
	local chart=$REPO_DIR/charts/layercache
	if [[ $overlay != default ]]; then
		[[ -f $chart/ci/$overlay-values.yaml ]] || die "no values $chart/ci/$overlay-values.yaml for config/$overlay"
		values=(--values "$chart/ci/$overlay-values.yaml")
	fi
	make -s -C "$REPO_DIR" "$REPO_DIR/bin/helm" >/dev/null
	kubectl apply --server-side -f "$REPO_DIR/config/default/namespace.yaml"
	# --take-ownership: a cluster deployed earlier with kpt or kubectl
	# (make up's default) keeps its objects, now the release's.
	"$REPO_DIR/bin/helm" --kubeconfig "$KUBECONFIG_FILE" upgrade --install layercache "$chart" \
		--namespace layercache-system "${values[@]}" --take-ownership --wait --timeout 3m
}

# deploy applies the project's e2e overlay, and restarts its pods when the
# image changed (same tag, new content).
deploy() {
	local name=e2e
	log "deploying config/$name (--deploy $DEPLOY)"
	mkdir -p "$STATE_DIR" "$LOG_DIR"
	if ! apply_config "$name" >"$LOG_DIR/deploy.log" 2>&1; then
		tail -30 "$LOG_DIR/deploy.log" >&2
		die "deploying config/$name failed (above; whole log: $LOG_DIR/deploy.log)"
	fi
	local digest stamp=$STATE_DIR/deployed-image
	digest=$(sha256sum "$IMAGES_DIR/layercache.tar" | cut -d' ' -f1)
	if [[ -f $stamp && $(<"$stamp") != "$digest" ]]; then
		kubectl -n layercache-system rollout restart daemonset >/dev/null
		# The manager shares the host's ports too: a rolling update's new
		# pod could never start beside the old one, so replace the pod.
		kubectl -n layercache-system delete pods -l app.kubernetes.io/component=manager --wait=false >/dev/null
	fi
	echo "$digest" >"$stamp"
	# rollout status can pass while a crash-looping pod is briefly up; the
	# Ready wait after it catches most of those.
	if ! kubectl -n layercache-system rollout status daemonset,deployment --timeout=180s >/dev/null ||
		! kubectl -n layercache-system wait --for=condition=Ready pods --all --timeout=60s >/dev/null; then
		kubectl -n layercache-system get pods -o wide >&2 || true
		kubectl -n layercache-system get events --sort-by=.lastTimestamp 2>&1 | tail -20 >&2 || true
		die "layercache did not roll out in 180s (pods and events above; logs: kubectl -n layercache-system logs POD)"
	fi
}

if [[ -n $BUILD_ONLY ]]; then
	[[ $BACKEND == local ]] || die "--build-only builds for the local backend only"
	build_local_only
	exit 0
fi

case $BACKEND in
local)
	up_local
	deploy
	registry_objects
	[[ -z $WITH_TEKTON ]] || "$CLUSTER_LIB/tekton.sh"
	[[ -z $WITH_ARGO ]] || "$CLUSTER_LIB/argo.sh"
	[[ -z $WITH_BUILDKIT ]] || "$CLUSTER_LIB/buildkit.sh"
	;;
kind)
	build_images
	"$CLUSTER_LIB/kind.sh" up "$NODES"
	deploy
	;;
esac

log "cluster up in $((SECONDS - start))s"
echo "export KUBECONFIG=$KUBECONFIG_FILE"
