// Package benchtime times what the benchmarks compare: two operations
// measured in turns in one run, so that a ratio of their medians holds on
// a shared, noisy machine.
package benchtime

import (
	"slices"
	"time"
)

// Compare runs a and b reps times each, in pairs whose order alternates,
// and returns the median duration of each. Each operation leaves deferred
// work (writeback, journal commits) that the next one pays for;
// alternating spreads it evenly, and medians ignore the odd slow sync.
func Compare(reps int, a, b func()) (time.Duration, time.Duration) {
	var ta, tb []time.Duration
	for i := range reps {
		if i%2 == 0 {
			ta = append(ta, Timed(a))
			tb = append(tb, Timed(b))
		} else {
			tb = append(tb, Timed(b))
			ta = append(ta, Timed(a))
		}
	}
	return Median(ta), Median(tb)
}

// Timed is how long fn takes.
func Timed(fn func()) time.Duration {
	start := time.Now()
	fn()
	return time.Since(start)
}

// Median is the median of ds, which it sorts; ds must not be empty.
func Median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}
