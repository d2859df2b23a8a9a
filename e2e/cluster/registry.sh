#!/usr/bin/env bash
# The e2e cluster's OCI registry, where node agents push and pull caches.
#
#   registry.sh install|start|stop|status|gc-dry-run
#
# Debian's docker-registry (distribution v2.8) as a process of its own on
# https://$REGISTRY_ADDRESS (lib.sh), with a certificate for 127.0.0.1 and
# localhost from the cluster's CA (up.sh makes $PKI_DIR/ca.crt) and htpasswd
# (bcrypt) auth for one user. The package's own service never runs.
#
# install: installs Debian's docker-registry if missing, its service
#   disabled (host-packages.sh and make e2e-build run it before any cluster).
# start: installs docker-registry if missing, writes what is missing or
#   stale under $REGISTRY_DIR (config.yml, htpasswd, the password, a docker
#   config.json with the credentials) and the certificate, starts the
#   registry unless it already runs and answers, and waits until it answers
#   /v2/ with the credentials. The blobs (data/) outlive stop and start:
#   tests stop the registry to simulate an outage.
# stop: stops it (TERM, then KILL; bounded) and keeps every file.
# status: says whether it runs and answers; exits 1 if not.
# gc-dry-run: runs the registry's garbage collection with --dry-run over
#   its storage and prints what it would delete ("blob eligible for
#   deletion: sha256:..." lines): the blobs no manifest of any repository
#   names. It deletes nothing, so it can run beside the scenarios, whose
#   blobs wait unnamed until their manifests are pushed (the real
#   collection would delete those). The config enables deletes
#   (storage.delete.enabled), so node agents delete the manifests of
#   deleted Caches.
#
# The registry is a host service outside the cluster's cgroup, as a
# registry is outside a real cluster, and it needs none of the cluster's
# processes. down.sh stops it with this script and removes $REGISTRY_DIR
# with the rest of the cluster. Log: $LOG_DIR/registry.log.
set -euo pipefail
# prepare runs in a command substitution: a failure there must stop it too.
shopt -s inherit_errexit
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REGISTRY_BIN=/usr/bin/docker-registry
CONFIG=$REGISTRY_DIR/config.yml
HTPASSWD=$REGISTRY_DIR/htpasswd
PASSWORD_FILE=$REGISTRY_DIR/password
DOCKER_CONFIG_FILE=$REGISTRY_DIR/docker/config.json
DATA_DIR=$REGISTRY_DIR/data
PID_FILE=$PID_DIR/registry.pid
LOG_FILE=$LOG_DIR/registry.log
START_TIMEOUT=30
STOP_TIMEOUT=10

usage() { die "usage: registry.sh install|start|stop|status|gc-dry-run"; }

install_registry() {
	# Under apt_install's policy the package's scripts start nothing. Its
	# service must not start on a later boot either: this harness runs its
	# own process, with its own config, and only while a cluster is up.
	# host-packages.sh installs the package with the others, then this.
	[[ -x $REGISTRY_BIN ]] || apt_install docker-registry
	if [[ -d /run/systemd/system ]]; then
		systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
		systemctl mask docker-registry.service >/dev/null
	elif command -v update-rc.d >/dev/null; then
		update-rc.d docker-registry disable >/dev/null 2>&1 || true
	fi
	[[ -x $REGISTRY_BIN ]] || die "the docker-registry package did not install $REGISTRY_BIN"
}

# our_pids: every process serving $CONFIG, whatever the pid file says (a
# pid file can be stale, or gone while the registry still runs).
our_pids() {
	local pid cmdline want
	want="$REGISTRY_BIN serve $CONFIG "
	for pid in $(pgrep -x docker-registry); do
		cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
		[[ $cmdline == "$want" ]] && echo "$pid"
	done
	return 0
}

# answers: the registry serves /v2/ over TLS that the cluster's CA verifies,
# to the credentials of $PASSWORD_FILE.
answers() {
	[[ -f $PASSWORD_FILE ]] || return 1
	curl -sf -o /dev/null --max-time 5 --cacert "$PKI_DIR/ca.crt" \
		-u "$REGISTRY_USER:$(<"$PASSWORD_FILE")" "https://$REGISTRY_ADDRESS/v2/"
}

# random_string N: N characters from [A-Za-z0-9].
random_string() {
	local s=
	while ((${#s} < $1)); do s+=$(head -c 64 /dev/urandom | base64 -w0 | tr -dc 'A-Za-z0-9'); done
	echo "${s:0:$1}"
}

# write_if_changed FILE MODE: FILE gets standard input, atomically, unless it
# holds that already; prints FILE if it was written.
write_if_changed() {
	local file=$1 mode=$2 tmp
	tmp=$(mktemp "$file.new-XXXXXX")
	cat >"$tmp"
	chmod "$mode" "$tmp"
	if [[ -f $file ]] && cmp -s "$tmp" "$file"; then
		rm -f "$tmp"
		return 0
	fi
	mv -f "$tmp" "$file"
	echo "$file"
}

# prepare writes the registry's files, and prints those of them that a
# running registry has read (config, htpasswd, certificate) and that are new.
prepare() {
	[[ -f $PKI_DIR/ca.crt && -f $PKI_DIR/ca.key ]] ||
		die "no cluster CA in $PKI_DIR (up.sh makes it): start the cluster with make up NODES=2, or up.sh --with registry"
	mkdir -p "$REGISTRY_DIR/docker" "$DATA_DIR" "$LOG_DIR" "$PID_DIR"
	chmod 700 "$REGISTRY_DIR"

	# The password is made once per cluster and kept: the Secrets and
	# cluster.json carry it.
	[[ -s $PASSWORD_FILE ]] || random_string 24 | write_if_changed "$PASSWORD_FILE" 600 >/dev/null
	local password
	password=$(<"$PASSWORD_FILE")

	# bcrypt, the only hash the registry's htpasswd accepts, through the C
	# library's crypt(3) (Debian's libxcrypt has it) from perl-base: no
	# htpasswd (apache2-utils) or Go helper to install or build. Cost 4, the
	# least bcrypt allows: the registry checks the hash on every request
	# (cost 10 took 80 ms each, a pull or push makes several), and the
	# password is random and lives only as long as the cluster. A line that
	# still verifies the password is kept, since every hash has a new salt.
	# shellcheck disable=SC2016 # the literal prefix of a cost-4 bcrypt hash
	local line='' cost='$2b$04$'
	[[ -f $HTPASSWD ]] && line=$(<"$HTPASSWD")
	if [[ $line != "$REGISTRY_USER:$cost"* ]] || ! bcrypt_verifies "$password" "${line#*:}"; then
		local hash
		hash=$(perl -e 'print crypt($ARGV[0], $ARGV[1])' "$password" "$cost$(random_string 22)")
		[[ $hash == "$cost"* ]] || die "crypt(3) here cannot make bcrypt hashes (got '$hash'); docker-registry needs them"
		echo "$REGISTRY_USER:$hash" | write_if_changed "$HTPASSWD" 600
	fi

	jq -n --arg registry "$REGISTRY_ADDRESS" --arg user "$REGISTRY_USER" --arg password "$password" \
		'{auths: {($registry): {username: $user, password: $password, auth: ("\($user):\($password)" | @base64)}}}' |
		write_if_changed "$DOCKER_CONFIG_FILE" 600 >/dev/null

	# A certificate from an earlier cluster's CA, or about to expire, is made anew.
	if ! [[ -f $PKI_DIR/registry.crt && -f $PKI_DIR/registry.key ]] ||
		! openssl verify -CAfile "$PKI_DIR/ca.crt" "$PKI_DIR/registry.crt" >/dev/null 2>&1 ||
		! openssl x509 -in "$PKI_DIR/registry.crt" -noout -checkend 86400 >/dev/null; then
		cert registry layercache-e2e-registry "" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
		chmod 600 "$PKI_DIR/registry.key"
		echo "$PKI_DIR/registry.crt"
	fi

	# The http secret signs upload state: fixed, so that an upload survives
	# a restart of the registry.
	[[ -s $REGISTRY_DIR/http-secret ]] || random_string 32 | write_if_changed "$REGISTRY_DIR/http-secret" 600 >/dev/null
	write_if_changed "$CONFIG" 600 <<EOF
# Written by e2e/cluster/registry.sh; rewritten at every start.
version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: $DATA_DIR
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDRESS
  secret: $(<"$REGISTRY_DIR/http-secret")
  tls:
    certificate: $PKI_DIR/registry.crt
    key: $PKI_DIR/registry.key
  headers:
    X-Content-Type-Options: [nosniff]
auth:
  htpasswd:
    realm: layercache-e2e
    path: $HTPASSWD
EOF
}

# bcrypt_verifies PASSWORD HASH
bcrypt_verifies() {
	perl -e 'exit(crypt($ARGV[0], $ARGV[1]) eq $ARGV[1] ? 0 : 1)' "$1" "$2"
}

start() {
	require_root
	install_registry
	local changed pids
	changed=$(prepare)
	pids=$(our_pids)
	if [[ -n $pids ]]; then
		if [[ -z $changed ]] && answers; then
			echo "$pids" | head -1 >"$PID_FILE"
			log "registry already running at https://$REGISTRY_ADDRESS (pid $(<"$PID_FILE"))"
			return
		fi
		if [[ -n $changed ]]; then
			log "restarting the registry for its new $(xargs -n1 basename <<<"$changed" | paste -sd' ')"
		else
			log "restarting the registry: it runs but does not answer"
		fi
		stop
	fi
	local holder
	holder=$(ss -Hltnp "sport = :$REGISTRY_PORT" 2>/dev/null)
	[[ -z $holder ]] || die "port $REGISTRY_PORT is in use, the registry needs it: $holder"

	# Not holding the lock (fd 9) that this script holds.
	(exec setsid "$REGISTRY_BIN" serve "$CONFIG" 9>&-) >>"$LOG_FILE" 2>&1 </dev/null &
	echo $! >"$PID_FILE"
	local pid i
	pid=$(<"$PID_FILE")
	for ((i = 0; i < START_TIMEOUT * 4; i++)); do
		answers && break
		kill -0 "$pid" 2>/dev/null || die "the registry exited at start; see $LOG_FILE: $(tail -3 "$LOG_FILE")"
		sleep 0.25
	done
	answers || die "the registry did not answer on https://$REGISTRY_ADDRESS/v2/ in ${START_TIMEOUT}s; see $LOG_FILE"
	log "registry running at https://$REGISTRY_ADDRESS (pid $pid), blobs in $DATA_DIR, log $LOG_FILE"
}

stop() {
	require_root
	local pids i
	mapfile -t pids < <(our_pids)
	if ((${#pids[@]} == 0)); then
		rm -f "$PID_FILE"
		return 0
	fi
	kill -TERM "${pids[@]}" 2>/dev/null || true
	for ((i = 0; i < STOP_TIMEOUT * 4; i++)); do
		[[ -z $(alive "${pids[@]}") ]] && break
		sleep 0.25
	done
	if [[ -n $(alive "${pids[@]}") ]]; then
		log "the registry did not stop in ${STOP_TIMEOUT}s on TERM; killing it"
		kill -KILL "${pids[@]}" 2>/dev/null || true
		for ((i = 0; i < 20; i++)); do
			[[ -z $(alive "${pids[@]}") ]] && break
			sleep 0.25
		done
	fi
	[[ -z $(alive "${pids[@]}") ]] || die "the registry (pid $(alive "${pids[@]}")) is still running after KILL"
	rm -f "$PID_FILE"
	log "registry stopped"
}

# alive PID...: the PIDs that still run.
alive() {
	local pid
	for pid; do
		kill -0 "$pid" 2>/dev/null && echo "$pid"
	done
	return 0
}

status() {
	local pids
	pids=$(our_pids)
	if [[ -z $pids ]]; then
		echo "registry stopped (blobs in $DATA_DIR)"
		return 1
	fi
	if ! answers; then
		echo "registry running (pid $pids) but not answering on https://$REGISTRY_ADDRESS/v2/; see $LOG_FILE"
		return 1
	fi
	echo "registry running at https://$REGISTRY_ADDRESS (pid $pids), blobs in $DATA_DIR, log $LOG_FILE"
}

# gc_dry_run: what the registry's garbage collection would delete now.
gc_dry_run() {
	require_root
	[[ -x $REGISTRY_BIN && -f $CONFIG ]] || die "no registry here ($REGISTRY_BIN, $CONFIG): start it with registry.sh start"
	"$REGISTRY_BIN" garbage-collect --dry-run "$CONFIG"
}

(($# == 1)) || usage
# One start or stop at a time (tests stop and start the registry).
locked() {
	mkdir -p "$OUT_DIR"
	exec 9>"$OUT_DIR/registry.lock"
	flock -w 60 9 || die "another registry.sh has held $OUT_DIR/registry.lock for 60s"
	"$@"
}
case $1 in
install) require_root; install_registry ;;
start) locked start ;;
stop) locked stop ;;
status) status ;;
gc-dry-run) locked gc_dry_run ;;
-h | --help) sed -n '2,33p' "$0" ;;
*) usage ;;
esac
