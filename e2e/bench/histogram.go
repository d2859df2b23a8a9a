package bench

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// Histogram is one Prometheus histogram as a process exposes it: the
// cumulative count of observations at or below each upper bound.
type Histogram struct {
	Bounds []float64 // ascending, the last +Inf
	Counts []float64 // cumulative, one per bound
}

// ParseHistogram reads histogram name (its _bucket series, without other
// labels than le) from a Prometheus text exposition. A process that has
// not registered it yields an error.
func ParseHistogram(text, name string) (Histogram, error) {
	series, err := ParseCounters(text, name+"_bucket")
	if err != nil {
		return Histogram{}, err
	}
	if len(series) == 0 {
		return Histogram{}, fmt.Errorf("no %s_bucket series in the metrics", name)
	}
	type bucket struct{ le, count float64 }
	buckets := make([]bucket, 0, len(series))
	for _, s := range series {
		le, err := strconv.ParseFloat(s.Labels["le"], 64)
		if err != nil {
			return Histogram{}, fmt.Errorf("%s_bucket: le %q: %w", name, s.Labels["le"], err)
		}
		buckets = append(buckets, bucket{le, s.Value})
	}
	slices.SortFunc(buckets, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	var h Histogram
	for _, b := range buckets {
		h.Bounds = append(h.Bounds, b.le)
		h.Counts = append(h.Counts, b.count)
	}
	if !math.IsInf(h.Bounds[len(h.Bounds)-1], 1) {
		return Histogram{}, fmt.Errorf("%s_bucket has no +Inf bucket", name)
	}
	return h, nil
}

// Count is the number of observations.
func (h Histogram) Count() float64 {
	if len(h.Counts) == 0 {
		return 0
	}
	return h.Counts[len(h.Counts)-1]
}

// Sub returns the observations made since before, a reading of the same
// process. A process that restarted meanwhile has fewer in some bucket:
// that is an error, since the difference would be meaningless.
func (h Histogram) Sub(before Histogram) (Histogram, error) {
	if before.Count() == 0 {
		return h, nil
	}
	if !slices.Equal(h.Bounds, before.Bounds) {
		return Histogram{}, fmt.Errorf("bucket bounds changed between the readings: %v, then %v", before.Bounds, h.Bounds)
	}
	out := Histogram{Bounds: h.Bounds, Counts: make([]float64, len(h.Counts))}
	for i := range h.Counts {
		out.Counts[i] = h.Counts[i] - before.Counts[i]
		if out.Counts[i] < 0 {
			return Histogram{}, fmt.Errorf("bucket le=%g went from %g to %g: the process restarted between the readings", h.Bounds[i], before.Counts[i], h.Counts[i])
		}
	}
	return out, nil
}

// Quantile estimates quantile q (0 < q < 1) as Prometheus's
// histogram_quantile does: linearly within the bucket that holds it, from
// 0 for the first. One in the +Inf bucket is the highest finite bound.
// NaN for an empty histogram.
func (h Histogram) Quantile(q float64) float64 {
	total := h.Count()
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	i, _ := slices.BinarySearchFunc(h.Counts, rank, cmp.Compare[float64])
	if i >= len(h.Bounds)-1 {
		return h.Bounds[len(h.Bounds)-2]
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.Bounds[i-1], h.Counts[i-1]
	}
	in := h.Counts[i] - below
	if in == 0 {
		return h.Bounds[i]
	}
	return lower + (h.Bounds[i]-lower)*(rank-below)/in
}
