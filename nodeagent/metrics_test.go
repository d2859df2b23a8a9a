package nodeagent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/layercache/layercache/layerfs"
)

// TestHitsBySource: a volume of a cache with a generation is a hit from
// the cache, one seeded from a fallback a hit from the fallback, and only
// one that starts empty a miss. Forgetting the cache drops every source.
func TestHitsBySource(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	pr := layerfs.CacheRef{Namespace: "ci", Name: "pr-1"}
	seed := &layerfs.Seed{Cache: layerfs.CacheRef{Namespace: "ci", Name: "main"}, Generation: 3}
	for _, v := range []*layerfs.Volume{{}, {SeededFrom: seed}, {SeededFrom: seed}, {BaseGeneration: 1}} {
		m.provisioned(pr, v)
	}
	for _, c := range []struct {
		name string
		got  prometheus.Metric
		want float64
	}{
		{"hits from the cache", m.hits.WithLabelValues("ci", "pr-1", hitCache), 1},
		{"hits from a fallback", m.hits.WithLabelValues("ci", "pr-1", hitFallback), 2},
		{"misses", m.misses.WithLabelValues("ci", "pr-1"), 1},
	} {
		if got := metricValue(t, c.got); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}

	m.provisioned(layerfs.CacheRef{Namespace: "ci", Name: "main"}, &layerfs.Volume{BaseGeneration: 3})
	m.forgetCache(pr)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "layercache_cache_hits_total" && len(f.GetMetric()) != 1 {
			t.Errorf("hits series after forgetting ci/pr-1: %v, want ci/main's only", f.GetMetric())
		}
	}
}
