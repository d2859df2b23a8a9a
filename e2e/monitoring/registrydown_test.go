//go:build e2e && monitoring && faults

package monitoring

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/e2e/framework"
)

// TestPublishFailingGoesPendingWithTheRegistryDown stops the registry, runs
// a build whose layer the node must publish, and waits for
// LayercachePublishFailing to go pending (its "for" is 10 minutes: pending
// is the rule's expression matching the fault). The registry is back
// within a minute whatever happens.
func TestPublishFailingGoesPendingWithTheRegistryDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	f := framework.New(t)
	pod := cachePod(t, f, "publish", "echo layer > /cache/file")
	prom := startPrometheus(ctx, t, f)
	prom.waitForTargets(ctx, t)

	if err := f.Cluster.StopRegistry(ctx); err != nil {
		t.Fatalf("stop the registry: %v", err)
	}
	stopped := time.Now()
	defer func() {
		// A fresh context: the registry comes back even after a timeout.
		restart, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.Cluster.StartRegistry(restart); err != nil {
			t.Errorf("restart the registry: %v", err)
		}
		t.Logf("registry down for %s", time.Since(stopped).Round(time.Second))
	}()

	if _, err := f.CreatePod(ctx, pod); err != nil {
		t.Fatalf("create the build pod: %v", err)
	}
	if _, err := f.WaitForPodPhase(ctx, pod.Name, corev1.PodSucceeded); err != nil {
		t.Fatalf("the build pod: %v", err)
	}
	built := time.Now()
	// Back within a minute of the stop, as the shared cluster asks.
	deadline := stopped.Add(50 * time.Second)
	for {
		alerts, err := prom.query(ctx, `ALERTS{alertname="LayercachePublishFailing"}`)
		if err == nil && len(alerts) > 0 {
			t.Logf("LayercachePublishFailing %s %s after the build ended (%s after the registry stopped): %v",
				alerts[0].Metric["alertstate"], time.Since(built).Round(time.Second), time.Since(stopped).Round(time.Second), alerts[0].Metric)
			return
		}
		if time.Now().After(deadline) {
			failures, _ := prom.query(ctx, `layercache_failures_total{operation="push"}`)
			t.Fatalf("LayercachePublishFailing not pending %s after the registry stopped (query error %v); push failures: %v", time.Since(stopped).Round(time.Second), err, failures)
		}
		time.Sleep(time.Second)
	}
}
