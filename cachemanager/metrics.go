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
	}
	for _, c := range []prometheus.Collector{m.releasedClaims, m.recordedOutcomes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register the manager's metrics: %w", err)
		}
	}
	return m, nil
}
