package cachemanager

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// outcomeUnknown labels a claim released after its pods were deleted
// before they were seen to end.
const outcomeUnknown = "unknown"

// Metrics are the manager's own metrics, registered where the caller says
// (the process: controller-runtime's registry, which it serves on
// --metrics-bind-address; tests: a registry of their own).
type Metrics struct {
	releasedClaims   *prometheus.CounterVec
	recordedOutcomes *prometheus.CounterVec
	// The cluster-wide lifecycle of Caches (expire.go, nssize.go).
	deletedCaches     *prometheus.CounterVec
	namespaceBytes    *prometheus.GaugeVec
	namespaceMaxBytes *prometheus.GaugeVec
}

// NewMetrics registers the manager's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		releasedClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_manager_released_claims_total",
			Help: "Layercache claims the manager deleted because their pods had ended, by pod outcome (succeeded, failed, unknown).",
		}, []string{"outcome"}),
		recordedOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_manager_recorded_outcomes_total",
			Help: "Pod outcomes the manager wrote on layercache volumes, by outcome (succeeded, failed).",
		}, []string{"outcome"}),
		deletedCaches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "layercache_caches_deleted_total",
			Help: "Caches the manager deleted, by reason: cluster-max-age (unused on every node for their max age) or namespace-size (least recently used over their namespace's bound).",
		}, []string{"reason"}),
		namespaceBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "layercache_namespace_cache_bytes",
			Help: "Total size of a namespace's caches, each counted by its largest node copy, as the namespace size bound counts it.",
		}, []string{"namespace"}),
		namespaceMaxBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "layercache_namespace_max_cache_bytes",
			Help: "The bound on the total size of a namespace's caches (annotation layercache.dev/max-cache-size or --namespace-max-cache-size); absent for a namespace without a bound.",
		}, []string{"namespace"}),
	}
	// Both reasons exist from the start, so that rate() sees the first.
	m.deletedCaches.WithLabelValues(deletedClusterMaxAge)
	m.deletedCaches.WithLabelValues(deletedNamespaceSize)
	for _, c := range []prometheus.Collector{m.releasedClaims, m.recordedOutcomes, m.deletedCaches, m.namespaceBytes, m.namespaceMaxBytes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register the manager's metrics: %w", err)
		}
	}
	return m, nil
}

// setNamespace reports a namespace's total and bound; a namespace without
// caches or without a bound has no series of that gauge, so that the
// gauges grow with the namespaces that use caches, not with all.
func (m *Metrics) setNamespace(namespace string, total int64, bound *sizeBound, hasCaches bool) {
	if hasCaches {
		m.namespaceBytes.WithLabelValues(namespace).Set(float64(total))
	} else {
		m.namespaceBytes.DeleteLabelValues(namespace)
	}
	if bound != nil && hasCaches {
		m.namespaceMaxBytes.WithLabelValues(namespace).Set(float64(bound.bytes))
	} else {
		m.namespaceMaxBytes.DeleteLabelValues(namespace)
	}
}

// forgetNamespace drops the series of a deleted namespace.
func (m *Metrics) forgetNamespace(namespace string) {
	m.namespaceBytes.DeleteLabelValues(namespace)
	m.namespaceMaxBytes.DeleteLabelValues(namespace)
}
