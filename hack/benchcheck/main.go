// Command benchcheck reads `go test -bench` output, prints each ratio the
// benchmarks report beside its target, and fails when one misses its
// target by more than the target's margin. Benchmarks compare layercache
// with a baseline in the same run; ratios are steadier than times, but not
// noise-free on a shared 2-core machine, hence the margin: a miss within
// it is printed, a miss beyond it fails `make bench`.
//
//	go test -bench . ... | tee bench.txt
//	benchcheck -targets hack/bench-targets.txt bench.txt
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// target is one line of the targets file:
// BENCHMARK METRIC <=|>= VALUE MARGIN.
type target struct {
	bench, metric string
	atMost        bool // "<=": the metric must not exceed value
	value, margin float64
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
		f := strings.Fields(line)
		if len(f) != 5 || (f[2] != "<=" && f[2] != ">=") {
			return nil, fmt.Errorf("targets line %d %q: want BENCHMARK METRIC <=|>= VALUE MARGIN", n, line)
		}
		value, err1 := strconv.ParseFloat(f[3], 64)
		margin, err2 := strconv.ParseFloat(f[4], 64)
		if err := errors.Join(err1, err2); err != nil || margin < 1 {
			return nil, fmt.Errorf("targets line %d %q: VALUE and MARGIN must be numbers, MARGIN >= 1: %v", n, line, err)
		}
		out = append(out, target{bench: f[0], metric: f[1], atMost: f[2] == "<=", value: value, margin: margin})
	}
	return out, sc.Err()
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

func run(targetsFile string, results io.Reader, w io.Writer) error {
	tf, err := os.Open(targetsFile)
	if err != nil {
		return err
	}
	defer tf.Close()
	targets, err := parseTargets(tf)
	if err != nil {
		return err
	}
	measured, err := parseResults(results)
	if err != nil {
		return err
	}
	var failed []string
	fmt.Fprintf(w, "%-36s %-26s %12s %10s  %s\n", "benchmark", "ratio", "measured", "target", "verdict")
	for _, t := range targets {
		v, ok := measured[t.bench][t.metric]
		if !ok {
			failed = append(failed, fmt.Sprintf("%s %s was not reported (did the benchmark run and fail?)", t.bench, t.metric))
			fmt.Fprintf(w, "%-36s %-26s %12s %10s  MISSING\n", t.bench, t.metric, "-", t)
			continue
		}
		verdict := t.verdict(v)
		if verdict == "FAIL" {
			failed = append(failed, fmt.Sprintf("%s %s = %.3g, target %s (margin %gx)", t.bench, t.metric, v, t, t.margin))
		}
		fmt.Fprintf(w, "%-36s %-26s %12.3g %10s  %s\n", t.bench, t.metric, v, t, verdict)
	}
	if len(failed) > 0 {
		return fmt.Errorf("benchmarks missed their targets by more than the margin:\n  %s", strings.Join(failed, "\n  "))
	}
	return nil
}

func main() {
	targets := flag.String("targets", "hack/bench-targets.txt", "targets file: BENCHMARK METRIC <=|>= VALUE MARGIN per line")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: benchcheck [-targets FILE] BENCH-OUTPUT\n")
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
	if err := run(*targets, f, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchcheck:", err)
		os.Exit(1)
	}
}
