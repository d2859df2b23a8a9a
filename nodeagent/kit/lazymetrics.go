package kit

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/layercache/layercache/layerfs"
)

// lazyCollector reports the store's layers mounted before their bytes
// were here, read from the store at each scrape: the store keeps the
// counts (layerfs.LazyStats), so nothing is counted twice or missed
// between the store and the agent.
type lazyCollector struct {
	stats func() layerfs.LazyStats
	descs lazyDescs
}

type lazyDescs struct {
	fetched, stalls, stallSeconds, failed, completed, completeSeconds, filling *prometheus.Desc
}

// NewLazyCollector collects stats, the store's LazyStats.
func NewLazyCollector(stats func() layerfs.LazyStats) prometheus.Collector {
	return &lazyCollector{stats: stats, descs: lazyDescs{
		fetched: prometheus.NewDesc("layercache_lazy_fetched_bytes_total",
			"Bytes of layers mounted before they were on the node, fetched from the registry, by source: for reads (demand) or to complete the copy (background).", []string{"source"}, nil),
		stalls: prometheus.NewDesc("layercache_lazy_read_stalls_total",
			"Reads of layers mounted before they were on the node that waited for the registry.", nil, nil),
		stallSeconds: prometheus.NewDesc("layercache_lazy_read_stall_seconds_total",
			"Time reads of layers mounted before they were on the node waited for the registry, in all.", nil, nil),
		failed: prometheus.NewDesc("layercache_lazy_failed_reads_total",
			"Reads of layers mounted before they were on the node that failed (EIO): the registry was away past the class's syncTimeout, or sent corrupt bytes. The volumes over such a layer are discarded at their end.", nil, nil),
		completed: prometheus.NewDesc("layercache_lazy_completed_layers_total",
			"Layers mounted before they were on the node whose copies were completed and settled.", nil, nil),
		completeSeconds: prometheus.NewDesc("layercache_lazy_complete_seconds_total",
			"Time from mount to settle of the completed layers, summed.", nil, nil),
		filling: prometheus.NewDesc("layercache_lazy_filling_layers",
			"Layers served now whose copies are not complete yet.", nil, nil),
	}}
}

func (c *lazyCollector) Describe(ch chan<- *prometheus.Desc) {
	d := c.descs
	for _, desc := range []*prometheus.Desc{d.fetched, d.stalls, d.stallSeconds, d.failed, d.completed, d.completeSeconds, d.filling} {
		ch <- desc
	}
}

func (c *lazyCollector) Collect(ch chan<- prometheus.Metric) {
	st, d := c.stats(), c.descs
	counter := prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(d.fetched, counter, float64(st.OnDemandBytes), "demand")
	ch <- prometheus.MustNewConstMetric(d.fetched, counter, float64(st.BackgroundBytes), "background")
	ch <- prometheus.MustNewConstMetric(d.stalls, counter, float64(st.ReadStalls))
	ch <- prometheus.MustNewConstMetric(d.stallSeconds, counter, st.ReadStallSeconds)
	ch <- prometheus.MustNewConstMetric(d.failed, counter, float64(st.FailedReads))
	ch <- prometheus.MustNewConstMetric(d.completed, counter, float64(st.CompletedLayers))
	ch <- prometheus.MustNewConstMetric(d.completeSeconds, counter, st.CompleteSeconds)
	ch <- prometheus.MustNewConstMetric(d.filling, prometheus.GaugeValue, float64(st.Filling))
}
