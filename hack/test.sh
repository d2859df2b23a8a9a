#!/usr/bin/env bash
# make test: every stage of the test run, the e2e cluster's builds beside
# the stages that need no cluster, then a table of where the time went
# (also in _output/test/stages.md), printed on failure too.
#
# Order (DEVELOPERS.md, "CI and its budget"):
#   host-packages   every Debian package, one apt transaction (two apt-get
#                   at once fail on dpkg's lock)
#   e2e-build       in the background: Kubernetes, the images, helm, Tekton,
#                   Argo and BuildKit (make e2e-build); its log is
#                   _output/test/e2e-build.log
#   verify-generate, test-unit, test-monitoring, test-envtest, test-scale, one after the other
#                   beside it (test-envtest's kube-apiserver waits for the
#                   same build, build-kubernetes.sh's lock, and is not
#                   built twice)
#   bench-smoke     alone: its ratios compare timings
#   e2e-up, e2e-packages, e2e-faults (make e2e's stages: one two-node
#                   cluster for every package, then the faults alone)
# A failed stage ends the run: the background build is stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=_output/test
mkdir -p "$OUT"
run_start=$(date +%s)
# One row per stage: name, start and end (seconds since the run's start),
# result.
names=() starts=() ends=() results=()
bg_pid= bg_name= bg_start=

stamp() { echo $(($(date +%s) - run_start)); }
banner() { printf '\n=== %s [%s] %s\n\n' "$(date +%H:%M:%S)" "$1" "$2"; }

record() {
	names+=("$1") starts+=("$2") ends+=("$3") results+=("$4")
}

# stage NAME COMMAND...: runs COMMAND in the foreground; a failure prints
# the table and ends the run.
stage() {
	local name=$1 start rc=0
	shift
	start=$(stamp)
	banner "$name" "$*"
	"$@" || rc=$?
	conclude "$name" "$start" "$(stamp)" "$rc"
}

# conclude NAME START END RC records a stage that ended; a failed one ends
# the run.
conclude() {
	local name=$1 start=$2 end=$3 rc=$4
	if ((rc != 0)); then
		record "$name" "$start" "$end" "FAILED ($rc)"
		banner "$name" "FAILED (exit $rc) in $((end - start)) s"
		stop_background
		fail
	fi
	record "$name" "$start" "$end" ok
	banner "$name" "passed in $((end - start)) s"
}

# background NAME COMMAND...: starts COMMAND in a session of its own (so
# that stop_background ends all of it), its output to $OUT/NAME.log.
background() {
	bg_name=$1 bg_start=$(stamp)
	shift
	banner "$bg_name" "started in the background: $* (log: $OUT/$bg_name.log)"
	rm -f "$OUT/$bg_name.end"
	# The end is stamped when the command ends, not when it is waited for.
	setsid bash -c '"${@:3}"; rc=$?; echo $(($(date +%s) - $1)) >"$2"; exit $rc' \
		background "$run_start" "$OUT/$bg_name.end" "$@" >"$OUT/$bg_name.log" 2>&1 &
	bg_pid=$!
}

# finish_background waits for the background stage and shows its log.
finish_background() {
	local rc=0
	banner "$bg_name" "waiting for it"
	wait "$bg_pid" || rc=$?
	bg_pid=
	cat "$OUT/$bg_name.log"
	conclude "$bg_name" "$bg_start" "$(cat "$OUT/$bg_name.end" 2>/dev/null || stamp)" "$rc"
}

stop_background() {
	[[ -n $bg_pid ]] || return 0
	kill -- "-$bg_pid" 2>/dev/null || true
	wait "$bg_pid" 2>/dev/null || true
	record "$bg_name" "$bg_start" "$(stamp)" stopped
	echo "--- the last lines of $OUT/$bg_name.log:"
	tail -20 "$OUT/$bg_name.log" || true
	bg_pid=
}

minutes() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }

# table prints the stages in the order they started, with the stages whose
# time overlapped theirs.
table() {
	local verdict=$1 i j beside order
	echo "make test: where the time went ($verdict)"
	echo
	echo "| stage | start (min) | minutes | result | beside |"
	echo "| --- | ---: | ---: | --- | --- |"
	order=$(for i in "${!names[@]}"; do echo "${starts[$i]} $i"; done | sort -n -s -k1,1 | cut -d' ' -f2)
	for i in $order; do
		beside=()
		for j in "${!names[@]}"; do
			((i != j && starts[j] < ends[i] && starts[i] < ends[j])) && beside+=("${names[$j]}")
		done
		printf '| %s | %s | %s | %s | %s |\n' "${names[$i]}" "$(minutes "${starts[$i]}")" \
			"$(minutes $((ends[i] - starts[i])))" "${results[$i]}" "$(IFS=,; echo "${beside[*]}" | sed 's/,/, /g')"
	done
	echo "| **all** | | **$(minutes "$(stamp)")** | | |"
}

print_table() {
	table "$1" | tee "$OUT/stages.md"
}

fail() {
	echo
	print_table FAILED
	exit 1
}

trap 'stop_background' EXIT

stage host-packages e2e/cluster/host-packages.sh
background e2e-build make --no-print-directory e2e-build
stage verify-generate make --no-print-directory verify-generate
stage test-unit make --no-print-directory test-unit
stage test-monitoring make --no-print-directory test-monitoring
stage test-envtest make --no-print-directory test-envtest
stage test-scale make --no-print-directory test-scale
finish_background
stage bench-smoke make --no-print-directory bench-smoke
stage e2e-up make --no-print-directory e2e-up
stage e2e-packages make --no-print-directory e2e-packages
stage e2e-faults make --no-print-directory e2e-faults
trap - EXIT
echo
print_table passed
