package kit

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/layercache/layercache/layerfs"
)

// Metrics are the node agent's Prometheus metrics. Per-cache series carry
// namespace and cache labels and are dropped when the cache leaves the node.
type Metrics struct {
	ProvisionSeconds *prometheus.HistogramVec
	CommitSeconds    prometheus.Histogram
	Hits, Misses     *prometheus.CounterVec
	bytes, layers    *prometheus.GaugeVec
	Generation       *prometheus.GaugeVec
	Failures         *prometheus.CounterVec
	Ends             *prometheus.CounterVec
	EndDelay         prometheus.Histogram

	RegistryBytes, RegistryLayers *prometheus.CounterVec
	RegistrySeconds               *prometheus.HistogramVec
	PublishLag                    prometheus.Histogram
	AnnounceWait                  *prometheus.HistogramVec
}

// Sources of the hits metric.
const (
	HitCache    = "cache"
	HitFallback = "fallback"
)

// Operations of the failures metric.
const (
	OpProvision = "provision"
	OpCommit    = "commit"
	OpDiscard   = "discard"
	OpRemount   = "remount"
	OpSquash    = "squash"
	OpGC        = "gc"
	OpReport    = "report"
	OpRemove    = "remove"
	OpRecover   = "recover"
	OpPush      = "push"
	OpPull      = "pull"
)

// Reasons of the failures metric that are not an Event reason.
const (
	FailureTooLarge      = "too-large"
	FailureNoSpace       = "no-space"
	FailureUnpublishable = "unpublishable"
	FailureUntrusted     = "untrusted-chain"
	FailureInvalidImage  = "invalid-image"
)

func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	cacheLabels := []string{"namespace", "cache"}
	// Mounts and commits are renames and mounts: milliseconds, unless the
	// disk or the kernel is in trouble, which the upper buckets show.
	buckets := prometheus.ExponentialBuckets(0.001, 2, 16) // 1ms .. 33s
	m := &Metrics{
		ProvisionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "layercache_provision_duration_seconds", Buckets: buckets,
			Help: "Time to provision a volume: validate the claim, mount the cache view, build the PV.",
		}, []string{"mode"}),
		CommitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "layercache_commit_duration_seconds", Buckets: buckets,
			Help: "Time to commit a released volume's changes as the cache's newest layer.",
		}),
		Hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_cache_hits_total",
			Help: "Volumes provisioned warm, by source: the cache's own committed generation on this node (cache), or, for a cache with none yet, a fallback's layers (fallback).",
		}, append(cacheLabels, "source")),
		Misses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_cache_misses_total",
			Help: "Volumes provisioned empty: the cache had nothing committed on this node yet and no fallback had either.",
		}, cacheLabels),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "layercache_cache_bytes",
			Help: "Bytes of a cache's committed layers on this node, including layers shared with other caches (a seeded cache's fallback): a sum over caches counts those more than once.",
		}, cacheLabels),
		layers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "layercache_cache_layers",
			Help: "Committed layers of a cache on this node.",
		}, cacheLabels),
		Generation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "layercache_cache_generation",
			Help: "Generation of a cache on this node.",
		}, cacheLabels),
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_failures_total",
			Help: "Failed operations by operation and reason.",
		}, []string{"operation", "reason"}),
		Ends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_volume_ends_total",
			Help: "Volumes whose build ended, by result (committed, discarded, dropped) and by what ended it: the pod's end (pod) or the claim's release (release).",
		}, []string{"result", "trigger"}),
		EndDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "layercache_volume_end_delay_seconds", Buckets: prometheus.ExponentialBucketsRange(0.01, 60, 24), // factor 1.46
			Help: "Time from the node agent's pod watch seeing a build's pod end (or go) to the end of its volume (committed or discarded): the agent's share of a build's end to its commit. The kubelet's report of the end, before it, is not in it.",
		}),
		RegistryBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_registry_bytes_total",
			Help: "Bytes of layers moved between this node and registries, by direction (push: compressed blobs; pull: layers unpacked on disk; copy: a seeded layer's blob copied from its fallback's repository; a mount moves none).",
		}, []string{"direction"}),
		RegistryLayers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_registry_layers_total",
			Help: "Layers moved between this node and registries, by direction (push, pull; mount and copy: a seeded layer's blob mounted or copied from its fallback's repository instead of pushed).",
		}, []string{"direction"}),
		RegistrySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "layercache_registry_duration_seconds", Buckets: buckets,
			Help: "Time to push one layer (export, compress, upload, append to the Cache's chain) or to pull a cache's missing layers.",
		}, []string{"direction"}),
		PublishLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "layercache_publish_lag_seconds", Buckets: prometheus.ExponentialBuckets(0.01, 2, 16), // 10ms .. 5.5min
			Help: "Time from a layer's commit to its append to the Cache's published chain: how long other nodes wait for it.",
		}),
		AnnounceWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "layercache_announced_wait_seconds", Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
			Help: "Time a provisioning waited for layers other nodes had announced, by outcome (arrived, timeout).",
		}, []string{"outcome"}),
	}
	for _, c := range []prometheus.Collector{m.ProvisionSeconds, m.CommitSeconds, m.Hits, m.Misses, m.bytes, m.layers, m.Generation, m.Failures, m.Ends, m.EndDelay, m.RegistryBytes, m.RegistryLayers, m.RegistrySeconds, m.PublishLag, m.AnnounceWait} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) Fail(op, reason string) {
	m.Failures.WithLabelValues(op, strings.ToLower(reason)).Inc()
}

func (m *Metrics) SetCache(info layerfs.CacheInfo) {
	ns, name := info.Cache.Namespace, info.Cache.Name
	m.bytes.WithLabelValues(ns, name).Set(float64(info.Bytes))
	m.layers.WithLabelValues(ns, name).Set(float64(len(info.Layers)))
	m.Generation.WithLabelValues(ns, name).Set(float64(info.Generation))
}

func (m *Metrics) ForgetCache(c layerfs.CacheRef) {
	for _, v := range []*prometheus.GaugeVec{m.bytes, m.layers, m.Generation} {
		v.DeleteLabelValues(c.Namespace, c.Name)
	}
	m.Hits.DeletePartialMatch(prometheus.Labels{"namespace": c.Namespace, "cache": c.Name})
	m.Misses.DeleteLabelValues(c.Namespace, c.Name)
}

// Provisioned counts a new volume of cache as a hit, by the source it
// starts from, or a miss.
func (m *Metrics) Provisioned(cache layerfs.CacheRef, v *layerfs.Volume) {
	switch {
	case v.BaseGeneration > 0:
		m.Hits.WithLabelValues(cache.Namespace, cache.Name, HitCache).Inc()
	case v.SeededFrom != nil:
		m.Hits.WithLabelValues(cache.Namespace, cache.Name, HitFallback).Inc()
	default:
		m.Misses.WithLabelValues(cache.Namespace, cache.Name).Inc()
	}
}
