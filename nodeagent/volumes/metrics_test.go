package volumes

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// TestHitsBySource: a volume of a cache with a generation is a hit from
// the cache, one seeded from a fallback a hit from the fallback, and only
// one that starts empty a miss. Forgetting the cache drops every source.
func TestHitsBySource(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := kit.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	pr := layerfs.CacheRef{Namespace: "ci", Name: "pr-1"}
	seed := &layerfs.Seed{Cache: layerfs.CacheRef{Namespace: "ci", Name: "main"}, Generation: 3}
	for _, v := range []*layerfs.Volume{{}, {SeededFrom: seed}, {SeededFrom: seed}, {BaseGeneration: 1}} {
		m.Provisioned(pr, v)
	}
	for _, c := range []struct {
		name string
		got  prometheus.Metric
		want float64
	}{
		{"hits from the cache", m.Hits.WithLabelValues("ci", "pr-1", kit.HitCache), 1},
		{"hits from a fallback", m.Hits.WithLabelValues("ci", "pr-1", kit.HitFallback), 2},
		{"misses", m.Misses.WithLabelValues("ci", "pr-1"), 1},
	} {
		if got := metricValue(t, c.got); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}

	m.Provisioned(layerfs.CacheRef{Namespace: "ci", Name: "main"}, &layerfs.Volume{BaseGeneration: 3})
	m.ForgetCache(pr)
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
