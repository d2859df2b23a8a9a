package bench

import (
	"math"
	"testing"
)

const histogramPage = `# HELP d_seconds A duration.
# TYPE d_seconds histogram
d_seconds_bucket{le="0.5"} 10
d_seconds_bucket{le="1"} 60
d_seconds_bucket{le="2"} 90
d_seconds_bucket{le="4"} 99
d_seconds_bucket{le="+Inf"} 100
d_seconds_sum 120
d_seconds_count 100
d_seconds_other{le="1"} 7
`

func TestHistogramQuantile(t *testing.T) {
	h, err := ParseHistogram(histogramPage, "d_seconds")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q, want float64
	}{
		{0.05, 0.25}, // half of the first bucket, from 0
		{0.5, 0.9},   // 40 of the 50 in (0.5, 1]
		{0.9, 2},     // the bucket's top
		{0.99, 4},
		{0.999, 4}, // in +Inf: the highest finite bound
	} {
		if got := h.Quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Quantile(%g) = %g, want %g", c.q, got, c.want)
		}
	}
}

func TestHistogramSub(t *testing.T) {
	before, err := ParseHistogram(histogramPage, "d_seconds")
	if err != nil {
		t.Fatal(err)
	}
	after := Histogram{Bounds: before.Bounds, Counts: []float64{10, 60, 90, 100, 101}}
	d, err := after.Sub(before)
	if err != nil {
		t.Fatal(err)
	}
	if d.Count() != 1 || d.Quantile(0.5) <= 2 || d.Quantile(0.5) > 4 {
		t.Errorf("difference %v: want one observation, in (2, 4]", d.Counts)
	}
	restarted := Histogram{Bounds: before.Bounds, Counts: []float64{0, 1, 1, 1, 1}}
	if _, err := restarted.Sub(before); err == nil {
		t.Error("Sub of a restarted process's reading: no error")
	}
	if _, err := ParseHistogram("other_bucket{le=\"1\"} 1\n", "d_seconds"); err == nil {
		t.Error("ParseHistogram of a page without the histogram: no error")
	}
}
