//go:build e2e

package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/layercache/layercache/e2e/framework"
	"github.com/layercache/layercache/layerfs"
)

// storeRoot is the node store as the node sees it.
const storeRoot = "/var/lib/layercache"

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux architecture's user ABI.
const clockTicks = 100

// agentProc is the node agent's process on this machine (the local
// cluster's nodes are processes of the host, so the test, which runs as
// root, reads /proc directly).
type agentProc struct {
	PID     int
	MaxLays int // its --max-layers
}

// findAgent finds the node agent of node: the process whose command line
// is `/layercache node ... --node-name=NODE`, as `pgrep -f "layercache
// node"` would, narrowed to the node.
func findAgent(node string) (agentProc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return agentProc{}, err
	}
	var found []agentProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) < 2 || filepath.Base(args[0]) != "layercache" || args[1] != "node" {
			continue
		}
		p := agentProc{PID: pid, MaxLays: layerfs.DefaultMaxLayers}
		mine := false
		for i, a := range args {
			if a == "--node-name="+node || (a == "--node-name" && i+1 < len(args) && args[i+1] == node) {
				mine = true
			}
			if v, ok := strings.CutPrefix(a, "--max-layers="); ok {
				if n, err := strconv.Atoi(v); err == nil {
					p.MaxLays = n
				}
			}
		}
		if mine {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		return agentProc{}, fmt.Errorf("%d node agent processes of node %s on this machine, want 1 (the local cluster's backend runs nodes as host processes)", len(found), node)
	}
	return found[0], nil
}

// rssBytes reads VmRSS of pid.
func rssBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// cpuSeconds reads utime+stime of pid.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses: fields start
	// after the last ')'. utime and stime are fields 14 and 15, the 12th
	// and 13th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return float64(ut+st) / clockTicks, nil
}

// uptimeClock converts /proc/uptime readings (CLOCK_BOOTTIME, which
// containers share with the host: containerd makes no time namespace)
// into wall-clock times of this machine, at 10 ms resolution.
type uptimeClock struct{ boot time.Time }

func newUptimeClock() (uptimeClock, error) {
	before := time.Now()
	b, err := os.ReadFile("/proc/uptime")
	after := time.Now()
	if err != nil {
		return uptimeClock{}, err
	}
	up, err := parseUptime(string(b))
	if err != nil {
		return uptimeClock{}, err
	}
	mid := before.Add(after.Sub(before) / 2)
	return uptimeClock{boot: mid.Add(-up)}, nil
}

func (c uptimeClock) at(up time.Duration) time.Time { return c.boot.Add(up) }

// parseUptime reads the first number of a /proc/uptime line.
func parseUptime(s string) (time.Duration, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("uptime %q", s)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("uptime %q: %w", s, err)
	}
	return time.Duration(v * float64(time.Second)), nil
}

// head is the part of a cache's head.json the test reads.
type head struct {
	Generation int64 `json:"generation"`
	Layers     []struct {
		ID    string `json:"id"`
		Bytes int64  `json:"bytes"`
	} `json:"layers"`
}

func readHead(ctx context.Context, c *framework.Cluster, n framework.Node, namespace, cache string) (*head, error) {
	b, err := c.ReadNodeFile(ctx, n, storeRoot+"/caches/"+namespace+"/"+cache+"/head.json")
	if err != nil {
		return nil, err
	}
	var h head
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("head.json of %s/%s: %w", namespace, cache, err)
	}
	return &h, nil
}

// duBytes is what du says paths take on the node's disk, in bytes.
func duBytes(ctx context.Context, c *framework.Cluster, n framework.Node, paths ...string) (int64, error) {
	out, err := c.NodeExec(ctx, n, append([]string{"du", "-s", "-c", "-B1"}, paths...)...)
	if err != nil {
		return 0, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 2 || f[1] != "total" {
		return 0, fmt.Errorf("du: no total in %q", out)
	}
	return strconv.ParseInt(f[0], 10, 64)
}

// procSample is what the sampler saw of one node agent process. The
// agent gets a new process each time it restarts (the agent-kill fault),
// so the figures are kept per process.
type procSample struct {
	PID       int       `json:"pid"`
	FirstSeen time.Time `json:"firstSeen"`
	LastSeen  time.Time `json:"lastSeen"`
	PeakRSS   int64     `json:"peakRSSBytes"`
	LastRSS   int64     `json:"lastRSSBytes"`
	// CPUFirst is its utime+stime when the load began, 0 for a process
	// started during the load (all its CPU is the load's); CPULast is the
	// last reading, up to one sampling period before a killed process
	// died.
	CPUFirst float64 `json:"cpuFirst"`
	CPULast  float64 `json:"cpuLast"`
	Samples  int     `json:"samples"`
}

// sampler polls the node agent's RSS and CPU and the caches' depth while
// the load runs. It follows the agent across restarts: when its process
// is gone it looks for the node's agent again on each tick.
type sampler struct {
	mu         sync.Mutex
	node       string
	cur        int // pid followed, 0 while the agent is away
	procs      []*procSample
	Samples    int
	Gaps       int // ticks with no agent process
	PeakLayers int
	PeakCache  string
}

// start records the agent at the load's start: its CPU so far is not
// the load's.
func (s *sampler) start(node string, agent agentProc) error {
	cpu, err := cpuSeconds(agent.PID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.node = node
	s.cur = agent.PID
	now := time.Now()
	s.procs = append(s.procs, &procSample{PID: agent.PID, FirstSeen: now, LastSeen: now, CPUFirst: cpu, CPULast: cpu})
	return nil
}

// sample reads the followed process, or finds the agent's new one.
func (s *sampler) sample() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node == "" {
		return
	}
	if s.cur != 0 && s.read(s.cur) {
		return
	}
	s.cur = 0
	a, err := findAgent(s.node)
	if err != nil {
		s.Gaps++
		return
	}
	if !slices.ContainsFunc(s.procs, func(p *procSample) bool { return p.PID == a.PID }) {
		s.procs = append(s.procs, &procSample{PID: a.PID, FirstSeen: time.Now()})
	}
	if s.read(a.PID) {
		s.cur = a.PID
	} else {
		s.Gaps++
	}
}

// read samples pid; false if it is gone. Called with mu held.
func (s *sampler) read(pid int) bool {
	rss, err1 := rssBytes(pid)
	cpu, err2 := cpuSeconds(pid)
	if err1 != nil || err2 != nil {
		return false
	}
	for _, p := range s.procs {
		if p.PID == pid {
			p.PeakRSS, p.LastRSS, p.CPULast = max(p.PeakRSS, rss), rss, cpu
			p.LastSeen = time.Now()
			p.Samples++
		}
	}
	s.Samples++
	return true
}

// totals: the peak RSS of any agent process, and the CPU of all of them
// summed over the load.
func (s *sampler) totals() (peakRSS int64, cpu float64, procs []procSample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		peakRSS = max(peakRSS, p.PeakRSS)
		cpu += p.CPULast - p.CPUFirst
		procs = append(procs, *p)
	}
	return peakRSS, cpu, procs
}

// run samples until ctx ends; node is the test's node as it is now (the
// node-restart fault gives it a new process).
func (s *sampler) run(ctx context.Context, c *framework.Cluster, node func() framework.Node, namespace string, caches []string) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.sample()
		if i%2 != 0 {
			continue
		}
		n := node()
		for _, cache := range caches {
			h, err := readHead(ctx, c, n, namespace, cache)
			if err != nil {
				continue // not created yet, or being replaced
			}
			s.mu.Lock()
			if len(h.Layers) > s.PeakLayers {
				s.PeakLayers, s.PeakCache = len(h.Layers), cache
			}
			s.mu.Unlock()
		}
	}
}
