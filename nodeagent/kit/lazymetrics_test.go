package kit

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/layercache/layercache/layerfs"
)

func TestLazyCollector(t *testing.T) {
	st := layerfs.LazyStats{OnDemandBytes: 3 << 20, BackgroundBytes: 5 << 20, ReadStalls: 7, ReadStallSeconds: 1.5,
		FailedReads: 2, CompletedLayers: 1, CompleteSeconds: 4.25, Filling: 3}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewLazyCollector(func() layerfs.LazyStats { return st }))
	want := `
# HELP layercache_lazy_fetched_bytes_total Bytes of layers mounted before they were on the node, fetched from the registry, by source: for reads (demand) or to complete the copy (background).
# TYPE layercache_lazy_fetched_bytes_total counter
layercache_lazy_fetched_bytes_total{source="background"} 5.24288e+06
layercache_lazy_fetched_bytes_total{source="demand"} 3.145728e+06
# HELP layercache_lazy_filling_layers Layers served now whose copies are not complete yet.
# TYPE layercache_lazy_filling_layers gauge
layercache_lazy_filling_layers 3
# HELP layercache_lazy_failed_reads_total Reads of layers mounted before they were on the node that failed (EIO): the registry was away past the class's syncTimeout, or sent corrupt bytes. The volumes over such a layer are discarded at their end.
# TYPE layercache_lazy_failed_reads_total counter
layercache_lazy_failed_reads_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "layercache_lazy_fetched_bytes_total", "layercache_lazy_filling_layers", "layercache_lazy_failed_reads_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 8 {
		t.Errorf("gathered %d series (%v), want 8", n, err)
	}
}
