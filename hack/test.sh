#!/usr/bin/env bash
# make test: every stage of the test run in three lanes, then a table of
# where the time went (also in _output/test/stages.md), printed on failure
# too.
#
# Order (DEVELOPERS.md, "CI and its budget"): the critical path is the
# cluster's builds, then the e2e. The base cluster (Kubernetes, the
# images, helm, the registry) builds first with both cores, and the fault
# tests, which need no more than that, run on it while the rest builds and
# the unit stages run beside them:
#
#   foreground    host-packages, e2e-build-base, bench-smoke (alone: its
#                 ratios compare timings; after the e2e, the cluster's
#                 clean-up once made one miss by more than its margin),
#                 e2e-up-base, e2e-faults, e2e-up (adds Tekton, Argo and
#                 BuildKit), e2e-packages
#   generate      verify-generate, beside e2e-build-base and joined before
#                 bench-smoke (it rewrites the chart's copied files)
#   checks        test-unit, test-monitoring, test-envtest, test-scale,
#                 from the end of bench-smoke
#   add-ons       e2e-build-add-ons (Tekton, Argo, BuildKit), from the end of
#                 bench-smoke, joined before e2e-up
#
# A background lane writes to _output/test/LANE.log, shown when it is
# joined. A failed stage, in any lane, ends the run at once: the other
# lanes and the foreground stage are stopped (rows "stopped").
set -euo pipefail
# Job control: each background job has a process group of its own, which
# stop_all ends whole.
set -m
cd "$(dirname "$0")/.."

OUT=_output/test
mkdir -p "$OUT"
ROWS=$OUT/rows
rm -f "$ROWS" "$OUT"/running.* "$OUT"/*.failed
run_start=$(date +%s)
declare -A lane_pids=()
fg_pid=

stamp() { echo $(($(date +%s) - run_start)); }
banner() { printf '\n=== %s [%s] %s\n\n' "$(date +%H:%M:%S)" "$1" "$2"; }
minutes() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }

# run NAME COMMAND...: one stage, in any lane. Its row (name, start, end in
# seconds since the run's start, result) goes to $ROWS when it ends; while
# it runs, $OUT/running.NAME holds its start, for stop_all's "stopped" row.
run() {
	local name=$1 start end rc=0
	shift
	start=$(stamp)
	echo "$start" >"$OUT/running.$name"
	banner "$name" "$*"
	"$@" || rc=$?
	end=$(stamp)
	if ((rc == 0)); then
		printf '%s\t%s\t%s\tok\n' "$name" "$start" "$end" >>"$ROWS"
		banner "$name" "passed in $((end - start)) s"
	else
		printf '%s\t%s\t%s\tFAILED (%s)\n' "$name" "$start" "$end" "$rc" >>"$ROWS"
		banner "$name" "FAILED (exit $rc) in $((end - start)) s"
	fi
	rm -f "$OUT/running.$name"
	return "$rc"
}

# stage NAME COMMAND...: a foreground stage. It runs as a job, so that a
# lane's failure (SIGUSR1) interrupts the wait for it.
stage() {
	local rc=0
	run "$@" &
	fg_pid=$!
	wait "$fg_pid" || rc=$?
	fg_pid=
	((rc == 0)) || fail "$1"
}

# lane NAME TARGET...: runs make TARGET... one after the other in the
# background, each a stage of its name; a failure signals the foreground.
lane() {
	local name=$1
	shift
	banner "$name" "lane started in the background: make $* (log: $OUT/$name.log)"
	(
		trap - EXIT USR1 INT TERM
		for target; do
			if ! run "$target" make --no-print-directory "$target"; then
				touch "$OUT/$name.failed"
				kill -USR1 $$
				exit 1
			fi
		done
	) >"$OUT/$name.log" 2>&1 &
	lane_pids[$name]=$!
}

# join NAME waits for a lane and shows its log.
join() {
	local name=$1 rc=0
	banner "$name" "waiting for the lane"
	wait "${lane_pids[$name]}" || rc=$?
	unset "lane_pids[$name]"
	cat "$OUT/$name.log"
	((rc == 0)) || fail "$name"
	banner "$name" "lane done"
}

# lane_failed: a lane's stage failed while the foreground ran or waited.
lane_failed() {
	local log
	for log in "$OUT"/*.failed; do
		[[ -e $log ]] || continue
		log=${log%.failed}.log
		echo "--- $log, the failed lane's output:"
		cat "$log"
	done
	fail "a background lane"
}

# stop_all ends the foreground stage and every lane, with a "stopped" row
# for each stage they were running.
stop_all() {
	local pid f
	for pid in $fg_pid "${lane_pids[@]}"; do
		kill -- "-$pid" 2>/dev/null || true
	done
	for pid in $fg_pid "${lane_pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	fg_pid=
	lane_pids=()
	for f in "$OUT"/running.*; do
		[[ -e $f ]] || continue
		printf '%s\t%s\t%s\tstopped\n' "${f##*/running.}" "$(<"$f")" "$(stamp)" >>"$ROWS"
		rm -f "$f"
	done
}

# table prints the stages in the order they started, with the stages whose
# time overlapped theirs.
table() {
	local verdict=$1 i j beside names=() starts=() ends=() results=() name start end result
	while IFS=$'\t' read -r name start end result; do
		names+=("$name") starts+=("$start") ends+=("$end") results+=("$result")
	done < <(sort -t$'\t' -k2,2n -s "$ROWS" 2>/dev/null)
	echo "make test: where the time went ($verdict)"
	echo
	echo "| stage | start (min) | minutes | result | beside |"
	echo "| --- | ---: | ---: | --- | --- |"
	for i in "${!names[@]}"; do
		beside=()
		for j in "${!names[@]}"; do
			((i != j && starts[j] < ends[i] && starts[i] < ends[j])) && beside+=("${names[$j]}")
		done
		printf '| %s | %s | %s | %s | %s |\n' "${names[$i]}" "$(minutes "${starts[$i]}")" \
			"$(minutes $((ends[i] - starts[i])))" "${results[$i]}" "$(IFS=,; echo "${beside[*]}" | sed 's/,/, /g')"
	done
	echo "| **all** | | **$(minutes "$(stamp)")** | | |"
}

fail() {
	trap - USR1 INT TERM
	banner "$1" "failed: stopping the run"
	stop_all
	echo
	table FAILED | tee "$OUT/stages.md"
	exit 1
}

trap stop_all EXIT
trap lane_failed USR1
# The jobs' process groups do not get a terminal's Ctrl-C: end them here.
trap 'fail interrupted' INT TERM

stage host-packages e2e/cluster/host-packages.sh
lane generate verify-generate
stage e2e-build-base make --no-print-directory e2e-build-base
join generate
stage bench-smoke make --no-print-directory bench-smoke
lane checks test-unit test-monitoring test-envtest test-scale
lane add-ons e2e-build-add-ons
stage e2e-up-base make --no-print-directory e2e-up-base
stage e2e-faults make --no-print-directory e2e-faults
join add-ons
stage e2e-up make --no-print-directory e2e-up
stage e2e-packages make --no-print-directory e2e-packages
join checks
trap - EXIT USR1 INT TERM
echo
table passed | tee "$OUT/stages.md"
