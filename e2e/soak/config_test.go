//go:build e2e

package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// config is one load run's parameters, from SOAK_* environment variables.
// The defaults are the short version that `make e2e` runs; `make soak`
// runs SOAK_CONCURRENT=50 SOAK_BUILDS=500.
type config struct {
	// Concurrent build pods: all at once in phase 1, at most this many
	// running in phase 2.
	Concurrent int `json:"concurrent"`
	// Builds is how many pods phase 2 completes.
	Builds int `json:"builds"`
	// Caches the builds spread over.
	Caches int `json:"caches"`
	// FailPercent of the builds exit 1.
	FailPercent int `json:"failPercent"`
	// Volume: claim, csi or both (builds alternate).
	Volume string `json:"volume"`
	// Duration bounds phases 1 and 2 together.
	Duration time.Duration `json:"duration"`
	// Seed of the random outcomes.
	Seed int64 `json:"seed"`
	// FileBytes each build writes.
	FileBytes int `json:"fileBytes"`
	// KeepEvery: every KeepEvery-th build pod is kept, the others are
	// deleted as soon as they end.
	KeepEvery int `json:"keepEvery"`
	// Output is the directory of report.md and report.json.
	Output string `json:"output"`

	// Fault injected while phase 2 runs: none, agent-kill, agent-oom,
	// apiserver, node-restart, node-reboot, manager-leader (SOAK_FAULT;
	// see fault_test.go) or registry (registry_test.go).
	Fault string `json:"fault"`
	// FaultKills is how many times agent-kill SIGKILLs the node agent,
	// or agent-oom has the kernel's OOM killer kill it.
	FaultKills int `json:"faultKills,omitempty"`
	// FaultEvery is the wait before each fault, from phase 2's start or
	// from the agent's return after the previous kill.
	FaultEvery time.Duration `json:"faultEvery,omitempty"`
	// FaultDown is how long apiserver keeps etcd and kube-apiserver
	// stopped, and registry the registry.
	FaultDown time.Duration `json:"faultDown,omitempty"`
	// QuietWatch is how long registry watches the test's namespace for
	// writes once everything is checked and cleaned up (SOAK_QUIET_WATCH).
	QuietWatch time.Duration `json:"quietWatch,omitempty"`
}

// Faults the load can run under.
const (
	faultNone          = "none"
	faultAgentKill     = "agent-kill"
	faultAgentOOM      = "agent-oom"
	faultAPIServer     = "apiserver"
	faultNodeRestart   = "node-restart"
	faultNodeReboot    = "node-reboot"
	faultManagerLeader = "manager-leader"
	faultRegistry      = "registry"
)

var faults = []string{faultNone, faultAgentKill, faultAgentOOM, faultAPIServer, faultNodeRestart, faultNodeReboot, faultManagerLeader, faultRegistry}

// agentFault tells whether fault kills the node agent's process (and the
// kubelet restarts it).
func agentFault(fault string) bool {
	return fault == faultAgentKill || fault == faultAgentOOM
}

// nodeFault tells whether fault stops the node's kubelet (node-restart,
// node-reboot): meanwhile the API server cannot serve pod logs.
func nodeFault(fault string) bool {
	return fault == faultNodeRestart || fault == faultNodeReboot
}

func loadConfig() (config, error) {
	c := config{Concurrent: 10, Builds: 40, Caches: 5, FailPercent: 10, Volume: "both",
		Duration: 3 * time.Minute, Seed: time.Now().UnixNano(), FileBytes: 64 << 10, KeepEvery: 10,
		Fault: faultNone, FaultKills: 3, FaultEvery: 20 * time.Second, FaultDown: 30 * time.Second, QuietWatch: 3 * time.Minute}
	ints := []struct {
		env string
		p   *int
		min int
	}{
		{"SOAK_CONCURRENT", &c.Concurrent, 1},
		{"SOAK_BUILDS", &c.Builds, 0},
		{"SOAK_CACHES", &c.Caches, 1},
		{"SOAK_FAIL_PERCENT", &c.FailPercent, 0},
		{"SOAK_FILE_BYTES", &c.FileBytes, 1},
		{"SOAK_KEEP_EVERY", &c.KeepEvery, 1},
		{"SOAK_FAULT_KILLS", &c.FaultKills, 1},
	}
	for _, i := range ints {
		s := os.Getenv(i.env)
		if s == "" {
			continue
		}
		v, err := strconv.Atoi(s)
		if err != nil || v < i.min {
			return c, fmt.Errorf("%s=%q: want an integer of at least %d", i.env, s, i.min)
		}
		*i.p = v
	}
	if c.FailPercent > 100 {
		return c, fmt.Errorf("SOAK_FAIL_PERCENT=%d: want 0 to 100", c.FailPercent)
	}
	if s := os.Getenv("SOAK_VOLUME"); s != "" {
		if s != "claim" && s != "csi" && s != "both" {
			return c, fmt.Errorf("SOAK_VOLUME=%q: want claim, csi or both", s)
		}
		c.Volume = s
	}
	durations := []struct {
		env string
		p   *time.Duration
	}{
		{"SOAK_DURATION", &c.Duration},
		{"SOAK_FAULT_EVERY", &c.FaultEvery},
		{"SOAK_FAULT_DOWN", &c.FaultDown},
		{"SOAK_QUIET_WATCH", &c.QuietWatch},
	}
	for _, d := range durations {
		s := os.Getenv(d.env)
		if s == "" {
			continue
		}
		v, err := time.ParseDuration(s)
		if err != nil || v <= 0 {
			return c, fmt.Errorf("%s=%q: want a positive duration such as 30s", d.env, s)
		}
		*d.p = v
	}
	if s := os.Getenv("SOAK_FAULT"); s != "" {
		if !slices.Contains(faults, s) {
			return c, fmt.Errorf("SOAK_FAULT=%q: want one of %v", s, faults)
		}
		if err := c.setFault(s); err != nil {
			return c, err
		}
	}
	if s := os.Getenv("SOAK_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return c, fmt.Errorf("SOAK_SEED=%q: want an integer", s)
		}
		c.Seed = v
	}
	c.Output = os.Getenv("SOAK_OUTPUT")
	if c.Output == "" {
		root, err := repoRoot()
		if err != nil {
			return c, err
		}
		c.Output = filepath.Join(root, "_output", "soak")
	} else if !filepath.IsAbs(c.Output) {
		root, err := repoRoot()
		if err != nil {
			return c, err
		}
		c.Output = filepath.Join(root, c.Output)
	}
	return c, nil
}

// setFault puts c under fault, with what the fault implies: a cache that
// syncs through a registry refuses CSI inline volumes
// (RegistryCacheNotInline), so the registry fault's builds use claims.
func (c *config) setFault(fault string) error {
	c.Fault = fault
	if fault == faultRegistry {
		if s := os.Getenv("SOAK_VOLUME"); s != "" && s != "claim" {
			return fmt.Errorf("SOAK_VOLUME=%q with SOAK_FAULT=registry: the registry's caches take claims only (CSI inline volumes are node-local); use claim", s)
		}
		c.Volume = "claim"
	}
	return nil
}

// repoRoot is the directory of go.mod above the test's directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s: set SOAK_OUTPUT", dir)
		}
	}
}
