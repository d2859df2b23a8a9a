// Command benchcheck reads `go test -bench` output, prints each ratio the
// benchmarks report beside its target, and fails when one misses its
// target by more than the target's margin. Benchmarks compare layercache
// with a baseline in the same run; ratios are steadier than times, but not
// noise-free on a shared 2-core machine, hence the margin: a miss within
// it is printed, a miss beyond it fails `make bench`.
//
// The benchmarks run at a size (LAYERCACHE_BENCH_SIZE, internal/benchsize):
// full for `make bench`, smoke for `make bench-smoke`. A target marked
// full or smoke applies at that size only (a ratio that needs a 1 GiB data
// set, or a metric whose name carries the size); one unmarked at both.
//
//	go test -bench . ... | tee bench.txt
//	benchcheck -size full -targets hack/bench-targets.txt bench.txt
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// target is one line of the targets file:
// BENCHMARK METRIC <=|>= VALUE MARGIN [full|smoke].
type target struct {
	bench, metric string
	atMost        bool // "<=": the metric must not exceed value
	value, margin float64
	size          string // full or smoke: the only size it applies at; "" for both
}

// sizes are the benchmarks' sizes (LAYERCACHE_BENCH_SIZE).
var sizes = []string{"full", "smoke"}

// appliesAt reports whether t is checked when the benchmarks ran at size.
func (t target) appliesAt(size string) bool {
	return t.size == "" || t.size == size
}

// verdict judges a measured value.
func (t target) verdict(v float64) string {
	ok := v >= t.value
	clear := v >= t.value/t.margin
	if t.atMost {
		ok, clear = v <= t.value, v <= t.value*t.margin
	}
	switch {
	case ok:
		return "ok"
	case clear:
		return "miss (within the margin)"
	}
	return "FAIL"
}

func (t target) String() string {
	op := ">="
	if t.atMost {
		op = "<="
	}
	return fmt.Sprintf("%s %g", op, t.value)
}

func parseTargets(r io.Reader) ([]target, error) {
	var out []target
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		t, err := parseTarget(strings.Fields(line))
		if err != nil {
			return nil, fmt.Errorf("targets line %d %q: %w", n, line, err)
		}
		out = append(out, t)
	}
	return out, sc.Err()
}

func parseTarget(f []string) (target, error) {
	if len(f) < 5 || len(f) > 6 || (f[2] != "<=" && f[2] != ">=") {
		return target{}, errors.New("want BENCHMARK METRIC <=|>= VALUE MARGIN [full|smoke]")
	}
	value, err1 := strconv.ParseFloat(f[3], 64)
	margin, err2 := strconv.ParseFloat(f[4], 64)
	if err := errors.Join(err1, err2); err != nil || margin < 1 {
		return target{}, fmt.Errorf("VALUE and MARGIN must be numbers, MARGIN >= 1: %v", err)
	}
	t := target{bench: f[0], metric: f[1], atMost: f[2] == "<=", value: value, margin: margin}
	if len(f) == 6 {
		if !slices.Contains(sizes, f[5]) {
			return target{}, fmt.Errorf("size %q: want one of %s, or none for both", f[5], strings.Join(sizes, ", "))
		}
		t.size = f[5]
	}
	return t, nil
}

// parseResults maps benchmark name (without the -GOMAXPROCS suffix) to
// its reported metrics.
func parseResults(r io.Reader) (map[string]map[string]float64, error) {
	out := map[string]map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndex(name, "-"); i > 0 {
			name = name[:i]
		}
		metrics := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				metrics[f[i+1]] = v
			}
		}
		out[name] = metrics
	}
	return out, sc.Err()
}

// run checks the results of benchmarks that ran at size against the
// targets that apply at it. A target whose metric was not reported fails:
// the benchmark failed, or no longer reports it, or reports it under
// another size's name.
func run(targetsFile, size string, results io.Reader, w io.Writer) error {
	if !slices.Contains(sizes, size) {
		return fmt.Errorf("size %q: want one of %s", size, strings.Join(sizes, ", "))
	}
	tf, err := os.Open(targetsFile)
	if err != nil {
		return err
	}
	defer tf.Close()
	targets, err := parseTargets(tf)
	if err != nil {
		return fmt.Errorf("%s: %w", targetsFile, err)
	}
	measured, err := parseResults(results)
	if err != nil {
		return fmt.Errorf("reading the benchmarks' output: %w", err)
	}
	failed, err := check(targets, size, measured, w)
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("benchmarks missed their targets by more than the margin:\n  %s", strings.Join(failed, "\n  "))
	}
	return nil
}

// check prints each target that applies at size beside its measured
// value, and returns what failed.
func check(targets []target, size string, measured map[string]map[string]float64, w io.Writer) ([]string, error) {
	var failed []string
	checked := 0
	fmt.Fprintf(w, "size %s: the targets unmarked or marked %s\n", size, size)
	fmt.Fprintf(w, "%-36s %-26s %12s %10s  %s\n", "benchmark", "ratio", "measured", "target", "verdict")
	for _, t := range targets {
		if !t.appliesAt(size) {
			continue
		}
		checked++
		v, ok := measured[t.bench][t.metric]
		if !ok {
			failed = append(failed, fmt.Sprintf("%s %s was not reported (did the benchmark fail, or run at another size than %s?)", t.bench, t.metric, size))
			fmt.Fprintf(w, "%-36s %-26s %12s %10s  MISSING\n", t.bench, t.metric, "-", t)
			continue
		}
		verdict := t.verdict(v)
		if verdict == "FAIL" {
			failed = append(failed, fmt.Sprintf("%s %s = %.3g, target %s (margin %gx)", t.bench, t.metric, v, t, t.margin))
		}
		fmt.Fprintf(w, "%-36s %-26s %12.3g %10s  %s\n", t.bench, t.metric, v, t, verdict)
	}
	if checked == 0 {
		return nil, fmt.Errorf("no target applies at size %s: nothing was checked", size)
	}
	return failed, nil
}

func main() {
	targets := flag.String("targets", "hack/bench-targets.txt", "targets file: BENCHMARK METRIC <=|>= VALUE MARGIN [full|smoke] per line")
	size := flag.String("size", "full", "the size the benchmarks ran at (LAYERCACHE_BENCH_SIZE): full or smoke; only targets unmarked or marked with it apply")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: benchcheck [-size full|smoke] [-targets FILE] BENCH-OUTPUT\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcheck:", err)
		os.Exit(2)
	}
	defer f.Close()
	if err := run(*targets, *size, f, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchcheck:", err)
		os.Exit(1)
	}
}
