//go:build e2e

package soak

import (
	"fmt"
	"os"
	"path/filepath"
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
}

func loadConfig() (config, error) {
	c := config{Concurrent: 10, Builds: 40, Caches: 5, FailPercent: 10, Volume: "both",
		Duration: 3 * time.Minute, Seed: time.Now().UnixNano(), FileBytes: 64 << 10, KeepEvery: 10}
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
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("SOAK_DURATION=%q: want a positive duration such as 30m", s)
		}
		c.Duration = d
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
