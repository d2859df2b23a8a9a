//go:build scale

package scale

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// report is what make scale writes: report.json and report.md.
type report struct {
	Started time.Time    `json:"started"`
	Seconds float64      `json:"seconds"`
	Config  reportConfig `json:"config"`
	Runs    []*run       `json:"runs"`
}

type reportConfig struct {
	Steady                 string  `json:"steady"`
	UpdatePeriod           string  `json:"updatePeriod"`
	Binary                 string  `json:"binary,omitempty"`
	MaxManagerWritesPerMin float64 `json:"maxManagerWritesPerMin"`
	MaxAgentGrowthMiB      float64 `json:"maxAgentGrowthMiB"`
}

// run is one cluster size's figures.
type run struct {
	Nodes   int     `json:"nodes"`
	Seconds float64 `json:"seconds"`
	Logs    string  `json:"logs"`

	SetupWrites  int64   `json:"setupWrites"`
	SetupSeconds float64 `json:"setupSeconds"`
	// PodsRunningSeconds is how long kwok took after the setup to have
	// every build pod Running.
	PodsRunningSeconds float64 `json:"podsRunningSeconds"`
	CatchUpSeconds     float64 `json:"catchUpSeconds"`
	// SetupReconciles counts the manager's reconciles per controller from
	// the empty cluster to the caught-up one.
	SetupReconciles map[string]float64 `json:"setupReconciles"`

	SteadyMinutes          float64            `json:"steadyMinutes"`
	ReplicaUpdatesPerMin   float64            `json:"replicaUpdatesPerMin"`
	ReplicaUpdatesDropped  int64              `json:"replicaUpdatesDropped"`
	SteadyReconcilesPerMin map[string]float64 `json:"steadyReconcilesPerMin"`
	// ManagerWritesPerMin is per HTTP method, from the manager's
	// rest_client_requests_total.
	ManagerWritesPerMin map[string]float64 `json:"managerWritesPerMin"`
	// APIServerWritesPerMin is per resource, from kube-apiserver's
	// apiserver_request_total (POST, PUT, PATCH, APPLY, DELETE): the
	// simulated agents' replica updates are the cachereplicas line.
	APIServerWritesPerMin map[string]float64 `json:"apiserverWritesPerMin"`
	WorkqueueDepth        map[string]float64 `json:"workqueueDepth"`

	ManagerEmptyMiB  float64 `json:"managerEmptyMiB"`
	ManagerSteadyMiB float64 `json:"managerSteadyMiB"`
	ManagerPeakMiB   float64 `json:"managerPeakMiB"`
	AgentEmptyMiB    float64 `json:"agentEmptyMiB,omitempty"`
	AgentFullMiB     float64 `json:"agentFullMiB,omitempty"`
	AgentPeakMiB     float64 `json:"agentPeakMiB,omitempty"`

	CacheBytes          int   `json:"cacheBytes"`
	CacheNodeCount      int32 `json:"cacheNodeCount"`
	CacheManagedFields  int   `json:"cacheManagedFields"`
	ReplicaCount        int   `json:"replicaCount"`
	LargestReplicaBytes int   `json:"largestReplicaBytes"`

	Checks []check `json:"checks"`
}

// check is one target: a measured value against its limit.
type check struct {
	What  string  `json:"what"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Unit  string  `json:"unit"`
	OK    bool    `json:"ok"`
}

// check records value against limit and fails the test if it is over.
func (r *run) check(t *testing.T, what string, value, limit float64, unit string) {
	t.Helper()
	c := check{What: what, Value: value, Limit: limit, Unit: unit, OK: value <= limit}
	r.Checks = append(r.Checks, c)
	if !c.OK {
		t.Errorf("%s at %d nodes: %.1f %s, over the limit of %.1f %s", what, r.Nodes, value, unit, limit, unit)
	}
}

// write writes report.json and report.md into dir.
func (rep *report) write(dir string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(rep.markdown()), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// markdown is the report for people: one column per cluster size.
func (rep *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Scale of the control plane\n\n")
	fmt.Fprintf(&b, "%s, %.0f s in all. Steady state %s, each node reporting a new generation every %s. "+
		"etcd + kube-apiserver (envtest) and kwok; the real manager; simulated node agents (server-side apply of their CacheReplicas) and one real one.\n\n",
		rep.Started.Format(time.RFC3339), rep.Seconds, rep.Config.Steady, rep.Config.UpdatePeriod)
	if len(rep.Runs) == 0 {
		return b.String()
	}
	b.WriteString("| | " + join(rep.Runs, func(r *run) string { return fmt.Sprintf("%d nodes", r.Nodes) }) + " |\n")
	b.WriteString("| --- |" + strings.Repeat(" --- |", len(rep.Runs)) + "\n")
	row := func(name string, f func(r *run) string) {
		b.WriteString("| " + name + " | " + join(rep.Runs, f) + " |\n")
	}
	row("run time", func(r *run) string { return fmt.Sprintf("%.0f s", r.Seconds) })
	row("setup: API writes, time", func(r *run) string { return fmt.Sprintf("%d in %.0f s", r.SetupWrites, r.SetupSeconds) })
	row("kwok: all pods Running after setup", func(r *run) string { return fmt.Sprintf("%.0f s", r.PodsRunningSeconds) })
	row("manager catch-up after setup", func(r *run) string { return fmt.Sprintf("%.0f s", r.CatchUpSeconds) })
	row("Cache as stored (limit 1 MiB; etcd 1.5 MiB)", func(r *run) string {
		return fmt.Sprintf("%d B (%.1f KiB), %d managedFields entries", r.CacheBytes, kib(r.CacheBytes), r.CacheManagedFields)
	})
	row("Cache status.nodeCount", func(r *run) string { return fmt.Sprint(r.CacheNodeCount) })
	row("CacheReplicas, largest", func(r *run) string { return fmt.Sprintf("%d, %d B", r.ReplicaCount, r.LargestReplicaBytes) })
	row("manager RSS: empty, steady mean, peak", func(r *run) string {
		return fmt.Sprintf("%.0f, %.0f, %.0f MiB", r.ManagerEmptyMiB, r.ManagerSteadyMiB, r.ManagerPeakMiB)
	})
	row("manager reconciles during setup", func(r *run) string { return counts(r.SetupReconciles, "%.0f") })
	row("replica updates (steady)", func(r *run) string {
		return fmt.Sprintf("%.0f/min (%d dropped)", r.ReplicaUpdatesPerMin, r.ReplicaUpdatesDropped)
	})
	row("manager reconciles (steady)", func(r *run) string { return counts(r.SteadyReconcilesPerMin, "%.1f") + " /min" })
	row("manager writes (steady)", func(r *run) string {
		return fmt.Sprintf("%.1f/min: %s", sum(r.ManagerWritesPerMin), counts(r.ManagerWritesPerMin, "%.1f"))
	})
	row("API server writes (steady)", func(r *run) string {
		return fmt.Sprintf("%.0f/min: %s", sum(r.APIServerWritesPerMin), counts(r.APIServerWritesPerMin, "%.1f"))
	})
	row("manager queues at the end", func(r *run) string { return counts(r.WorkqueueDepth, "%.0f") })
	row("node agent RSS: empty cluster, full, peak", func(r *run) string {
		if r.AgentEmptyMiB == 0 {
			return "not run"
		}
		return fmt.Sprintf("%.0f, %.0f, %.0f MiB", r.AgentEmptyMiB, r.AgentFullMiB, r.AgentPeakMiB)
	})
	b.WriteString("\n## Targets\n\n| nodes | what | value | limit | |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range rep.Runs {
		for _, c := range r.Checks {
			ok := "ok"
			if !c.OK {
				ok = "**over**"
			}
			fmt.Fprintf(&b, "| %d | %s | %.1f %s | %.1f %s | %s |\n", r.Nodes, c.What, c.Value, c.Unit, c.Limit, c.Unit, ok)
		}
	}
	b.WriteString("\nLogs of each run (kwok, manager, node agent) are in the directory of its `logs` field in report.json.\n")
	return b.String()
}

func join(runs []*run, f func(*run) string) string {
	cells := make([]string, len(runs))
	for i, r := range runs {
		cells[i] = f(r)
	}
	return strings.Join(cells, " | ")
}

// counts renders m as "k v, k v" in key order ("none" when empty).
func counts(m map[string]float64, format string) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, k+" "+fmt.Sprintf(format, m[k]))
	}
	return strings.Join(parts, ", ")
}
