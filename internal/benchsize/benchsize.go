// Package benchsize is the one size knob of the benchmarks that make bench
// and make bench-smoke run (layerfs, remote, nodeagent): the environment
// variable LAYERCACHE_BENCH_SIZE, full (the default: the data sets
// docs/performance.md's figures come from) or smoke (small ones, so that every
// benchmark runs and every ratio is checked in about a minute). A
// benchmark picks each of its sizes with Pick; a specific knob
// (LAYERFS_BENCH_SEED_MIB and the like, read with Env) overrides the pick.
package benchsize

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// Var is the environment variable that sets the size.
const Var = "LAYERCACHE_BENCH_SIZE"

// number is what a benchmark sizes: counts, bytes, durations.
type number interface{ ~int | ~int64 }

// parse reads Var's value: anything but full, smoke or nothing is an
// error rather than the default, so that a typo never runs the 1 GiB
// data sets where a smoke run was meant (or the reverse).
func parse(v string) (smoke bool, err error) {
	switch v {
	case "", "full":
		return false, nil
	case "smoke":
		return true, nil
	}
	return false, fmt.Errorf("%s=%q: want full (the default) or smoke", Var, v)
}

// Smoke reports whether the benchmarks run at smoke size; tb fails when
// LAYERCACHE_BENCH_SIZE is set to something else than full or smoke.
func Smoke(tb testing.TB) bool {
	tb.Helper()
	smoke, err := parse(os.Getenv(Var))
	if err != nil {
		tb.Fatal(err)
	}
	return smoke
}

// Pick returns full or smoke, whichever size the benchmarks run at.
func Pick[T number](tb testing.TB, full, smoke T) T {
	tb.Helper()
	if Smoke(tb) {
		return smoke
	}
	return full
}

// Env returns the positive number in the environment variable name, or
// def when it is unset: a benchmark's specific knob, which overrides the
// size's pick. want says what the number counts, for the error.
func Env[T number](tb testing.TB, name string, def T, want string) T {
	tb.Helper()
	n, err := parseEnv(name, os.Getenv(name), int64(def), want)
	if err != nil {
		tb.Fatal(err)
	}
	return T(n)
}

func parseEnv(name, v string, def int64, want string) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q: want %s (a positive integer)", name, v, want)
	}
	return n, nil
}

// Count names a count in a metric, as 100k or 1500: a metric whose name
// carries its data set's size names the size that ran.
func Count(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// Bytes names a byte size in a metric, as 64MiB or 1GiB.
func Bytes(n int64) string {
	for _, u := range []struct {
		name  string
		shift uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
