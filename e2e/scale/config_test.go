//go:build scale

package scale

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Targets of issue 18 at FullNodes simulated nodes.
const (
	// FullNodes is the cluster size the targets are stated for.
	FullNodes = 5000
	// ManagerRSSTargetMiB bounds the manager's peak memory at FullNodes.
	ManagerRSSTargetMiB = 512
	// CacheSizeTarget bounds a Cache used from every node, as stored.
	CacheSizeTarget = 1 << 20
	// EtcdObjectLimit is etcd's default request size limit
	// (--max-request-bytes, 1.5 MiB): the API server cannot store a larger
	// object.
	EtcdObjectLimit = 1536 * 1024
)

// config is one run of TestScale, read from the environment (SCALE_*).
type config struct {
	// Nodes are the cluster sizes, run one after the other, each on a fresh
	// control plane.
	Nodes []int
	// Steady is how long the steady state is measured, once every node's
	// objects exist and the manager has caught up.
	Steady time.Duration
	// UpdatePeriod is how often each node reports a new generation of the
	// shared cache in the steady state (its agent's commit), spread evenly:
	// Nodes/UpdatePeriod replica updates per second in all.
	UpdatePeriod time.Duration
	// Output is the directory of report.md and report.json.
	Output string
	// Binary is a prebuilt layercache binary; empty builds ./cmd/layercache
	// from this tree.
	Binary string
	// Agent runs one real node agent and samples its memory (needs root).
	Agent bool
	// MaxManagerWritesPerMin bounds the manager's writes per minute in the
	// steady state: no write storm.
	MaxManagerWritesPerMin float64
	// MaxAgentGrowthMiB bounds how much the node agent's memory may grow
	// from an empty cluster to the full one.
	MaxAgentGrowthMiB float64
}

// configFromEnv reads the SCALE_* variables; unset ones take the short
// version's values (make test-scale).
func configFromEnv(repo string) (config, error) {
	c := config{
		Nodes:                  []int{300},
		Steady:                 30 * time.Second,
		UpdatePeriod:           2 * time.Minute,
		Output:                 filepath.Join(repo, "_output", "scale"),
		Binary:                 os.Getenv("SCALE_LAYERCACHE_BIN"),
		Agent:                  true,
		MaxManagerWritesPerMin: 60,
		MaxAgentGrowthMiB:      16,
	}
	var errs []error
	if v := os.Getenv("SCALE_NODES"); v != "" {
		c.Nodes = nil
		for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 || n > 20000 {
				errs = append(errs, fmt.Errorf("SCALE_NODES=%q: %q is not a node count between 1 and 20000", v, f))
				continue
			}
			c.Nodes = append(c.Nodes, n)
		}
	}
	for _, d := range []struct {
		env string
		to  *time.Duration
	}{{"SCALE_STEADY", &c.Steady}, {"SCALE_UPDATE_PERIOD", &c.UpdatePeriod}} {
		v := os.Getenv(d.env)
		if v == "" {
			continue
		}
		p, err := time.ParseDuration(v)
		if err != nil || p < 10*time.Second {
			errs = append(errs, fmt.Errorf("%s=%q: use a duration of at least 10s, such as 3m", d.env, v))
			continue
		}
		*d.to = p
	}
	for _, f := range []struct {
		env string
		to  *float64
	}{{"SCALE_MAX_MANAGER_WRITES_PER_MIN", &c.MaxManagerWritesPerMin}, {"SCALE_MAX_AGENT_GROWTH_MIB", &c.MaxAgentGrowthMiB}} {
		v := os.Getenv(f.env)
		if v == "" {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || x <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: use a number above 0", f.env, v))
			continue
		}
		*f.to = x
	}
	if v := os.Getenv("SCALE_OUTPUT"); v != "" {
		c.Output = v
	}
	switch v := os.Getenv("SCALE_AGENT"); v {
	case "", "1", "true":
	case "0", "false":
		c.Agent = false
	default:
		errs = append(errs, fmt.Errorf("SCALE_AGENT=%q: use 1 (run a real node agent, needs root) or 0", v))
	}
	return c, errors.Join(errs...)
}

// managerRSSLimitMiB is the manager's memory bound at n nodes: the target
// at FullNodes and above, and below it a share of the target's
// per-node part on top of a fixed base (a controller-runtime process with
// its informers' caches empty takes about 40 MiB), so that the short
// version fails where a full run would.
func managerRSSLimitMiB(n int) float64 {
	const base = 96.0
	if n >= FullNodes {
		return ManagerRSSTargetMiB
	}
	return base + (ManagerRSSTargetMiB-base)*float64(n)/FullNodes
}
