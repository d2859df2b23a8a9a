package cachemanager

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// outcomeUnknown labels a claim released after its pods were deleted
// before they were seen to end.
const outcomeUnknown = "unknown"

var (
	releasedClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "layercache_manager_released_claims_total",
		Help: "Layercache claims the manager deleted because their pods had ended, by pod outcome (succeeded, failed, unknown).",
	}, []string{"outcome"})
	recordedOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "layercache_manager_recorded_outcomes_total",
		Help: "Pod outcomes the manager wrote on layercache volumes, by outcome (succeeded, failed).",
	}, []string{"outcome"})
)

func init() {
	// controller-runtime serves this registry on --metrics-bind-address.
	metrics.Registry.MustRegister(releasedClaims, recordedOutcomes)
}
