//go:build e2e && monitoring && faults

package monitoring

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/e2e/framework"
)

// TestPublishFailingFiresWithTheRegistryDown stops the registry, runs a
// build whose layer the node must publish, and waits for
// LayercachePublishFailing to go pending, then firing. Its "for" is 10
// minutes; this test's Prometheus loads the rules with that alert's "for"
// at 20 s, so that firing is seen within the test: the expression, its
// labels and the transition are the real ones. The registry is back
// within a minute whatever happens, and is started again as soon as the
// alert is pending (the expression counts failures over 15 minutes, so
// it stays true while the alert waits to fire).
func TestPublishFailingFiresWithTheRegistryDown(t *testing.T) {
	const alert = "LayercachePublishFailing"
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	f := framework.New(t)
	pod := cachePod(t, f, "publish", "echo layer > /cache/file")
	prom := startPrometheus(ctx, t, f, rulesWithFor(t, alert, "20s"))
	prom.waitForTargets(ctx, t)

	if err := f.Cluster.StopRegistry(ctx); err != nil {
		t.Fatalf("stop the registry: %v", err)
	}
	stopped := time.Now()
	var restartOnce sync.Once
	restart := func() {
		restartOnce.Do(func() {
			// A fresh context: the registry comes back even after a timeout.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := f.Cluster.StartRegistry(ctx); err != nil {
				t.Errorf("restart the registry: %v", err)
			}
			t.Logf("registry down for %s", time.Since(stopped).Round(time.Second))
		})
	}
	defer restart()

	if _, err := f.CreatePod(ctx, pod); err != nil {
		t.Fatalf("create the build pod: %v", err)
	}
	if _, err := f.WaitForPodPhase(ctx, pod.Name, corev1.PodSucceeded); err != nil {
		t.Fatalf("the build pod: %v", err)
	}
	built := time.Now()
	// Back within a minute of the stop, as the shared cluster asks.
	prom.waitForAlert(ctx, t, alert, "pending", stopped.Add(50*time.Second), built)
	restart()
	prom.waitForAlert(ctx, t, alert, "firing", time.Now().Add(time.Minute), built)
}

// waitForAlert waits until alert is in state (pending or firing) or
// deadline passes.
func (p *prometheus) waitForAlert(ctx context.Context, t *testing.T, alert, state string, deadline, since time.Time) {
	t.Helper()
	for {
		alerts, err := p.query(ctx, fmt.Sprintf(`ALERTS{alertname=%q,alertstate=%q}`, alert, state))
		if err == nil && len(alerts) > 0 {
			t.Logf("%s %s %s after the build ended: %v", alert, state, time.Since(since).Round(time.Second), alerts[0].Metric)
			return
		}
		if time.Now().After(deadline) {
			failures, _ := p.query(ctx, `layercache_failures_total{operation="push"}`)
			t.Fatalf("%s not %s %s after the build ended (query error %v); push failures: %v", alert, state, time.Since(since).Round(time.Second), err, failures)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s %s: %v", alert, state, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// rulesWithFor writes a copy of config/monitoring/rules.yaml in which
// alert's "for" is forDuration, and returns its path.
func rulesWithFor(t *testing.T, alert, forDuration string) string {
	t.Helper()
	data, err := os.ReadFile(rulesFile(t))
	if err != nil {
		t.Fatal(err)
	}
	var rules map[string]any
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatalf("parse the rules: %v", err)
	}
	found := false
	groups, _ := rules["groups"].([]any)
	for _, g := range groups {
		list, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range list {
			if r := r.(map[string]any); r["alert"] == alert {
				r["for"], found = forDuration, true
			}
		}
	}
	if !found {
		t.Fatalf("rules.yaml has no alert %s", alert)
	}
	out, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
