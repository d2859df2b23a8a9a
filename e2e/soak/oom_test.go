//go:build e2e

package soak

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// oomBound bounds agent-oom's wait for the kernel to kill the agent once
// its memory limit is down to its usage: a busy Go process allocates a
// page within a second.
const oomBound = time.Minute

// agentContainer is the node agent's container in its pod.
const agentContainer = "node"

// memcg is the memory controller of one cgroup: cgroup v1's memory
// hierarchy (the local cluster's hosts) or cgroup v2's unified one.
type memcg struct {
	dir string
	v2  bool
}

func (m memcg) limitFile() string {
	if m.v2 {
		return filepath.Join(m.dir, "memory.max")
	}
	return filepath.Join(m.dir, "memory.limit_in_bytes")
}

func (m memcg) usageFile() string {
	if m.v2 {
		return filepath.Join(m.dir, "memory.current")
	}
	return filepath.Join(m.dir, "memory.usage_in_bytes")
}

// oomKills is the cgroup's count of OOM kills (oom_kill in v1's
// memory.oom_control, v2's memory.events).
func (m memcg) oomKills() (int64, error) {
	name := "memory.oom_control"
	if m.v2 {
		name = "memory.events"
	}
	raw, err := os.ReadFile(filepath.Join(m.dir, name))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "oom_kill "); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no oom_kill line in %s", filepath.Join(m.dir, name))
}

// parseMemcg finds the memory cgroup in the contents of /proc/PID/cgroup
// (as read from the host's cgroup namespace): the v1 line whose
// controllers include memory, else the v2 line "0::PATH".
func parseMemcg(procCgroup []byte, fsRoot string) (memcg, error) {
	var v2 string
	found := false
	sc := bufio.NewScanner(bytes.NewReader(procCgroup))
	for sc.Scan() {
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		ctrls, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		for c := range strings.SplitSeq(ctrls, ",") {
			if c == "memory" {
				return memcg{dir: filepath.Join(fsRoot, "memory", path)}, nil
			}
		}
		if id == "0" && ctrls == "" {
			v2, found = path, true
		}
	}
	if !found {
		return memcg{}, errors.New("no memory controller line and no cgroup v2 line")
	}
	return memcg{dir: filepath.Join(fsRoot, v2), v2: true}, nil
}

func readInt(path string) (int64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
}

// alive tells whether pid runs (a zombie, killed and not yet reaped by
// its shim, does not).
func alive(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name's closing parenthesis.
	i := bytes.LastIndexByte(raw, ')')
	return i >= 0 && i+2 < len(raw) && raw[i+2] != 'Z'
}

// oomKill has the kernel's OOM killer kill pid: it lowers the memory limit
// of pid's cgroup to its usage, again and again as the usage moves (a v1
// limit below usage is refused with EBUSY when reclaim cannot get there),
// until the process's next allocation finds no page and the kernel kills
// it, then restores the limit, if the cgroup is still there (the kubelet's
// restart makes a new container, with a new cgroup). It returns the last
// limit set.
func oomKill(ctx context.Context, t *testing.T, pid int) (limit int64, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, fmt.Errorf("reading pid %d's cgroup: %w", pid, err)
	}
	cg, err := parseMemcg(raw, "/sys/fs/cgroup")
	if err != nil {
		return 0, fmt.Errorf("pid %d's memory cgroup in %q: %w", pid, raw, err)
	}
	orig, err := os.ReadFile(cg.limitFile())
	if err != nil {
		return 0, fmt.Errorf("the agent's memory limit: %w", err)
	}
	killsBefore, err := cg.oomKills()
	if err != nil {
		return 0, fmt.Errorf("the agent cgroup's OOM kills: %w", err)
	}
	defer func() {
		werr := os.WriteFile(cg.limitFile(), bytes.TrimSpace(orig), 0)
		if werr != nil && !errors.Is(werr, os.ErrNotExist) && !errors.Is(werr, syscall.ENODEV) {
			err = errors.Join(err, fmt.Errorf("restoring the memory limit %s of %s: %w", bytes.TrimSpace(orig), cg.dir, werr))
		}
	}()
	deadline := time.Now().Add(oomBound)
	var lastErr error
	for alive(pid) {
		if time.Now().After(deadline) {
			return limit, fmt.Errorf("pid %d still runs %s after its memory limit went down to its usage (last limit %d bytes in %s; last refusal: %v)",
				pid, oomBound, limit, cg.dir, lastErr)
		}
		usage, err := readInt(cg.usageFile())
		if err != nil {
			if !alive(pid) {
				break // the cgroup went with the killed container
			}
			return limit, fmt.Errorf("the agent's memory usage: %w", err)
		}
		target := usage &^ 4095
		if err := os.WriteFile(cg.limitFile(), []byte(strconv.FormatInt(target, 10)), 0); err != nil {
			// EBUSY: v1 could not reclaim down to it; the usage moves.
			lastErr = err
		} else {
			limit = target
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return limit, ctx.Err()
		}
	}
	if after, err := cg.oomKills(); err == nil {
		t.Logf("agent-oom: pid %d gone at a limit of %d bytes; its cgroup counts %d OOM kill(s) more", pid, limit, after-killsBefore)
		if after <= killsBefore {
			return limit, fmt.Errorf("pid %d ended but its cgroup %s counts no OOM kill (%d before, %d after): something else killed it", pid, cg.dir, killsBefore, after)
		}
	} else {
		t.Logf("agent-oom: pid %d gone at a limit of %d bytes; its cgroup went with it (%v)", pid, limit, err)
	}
	return limit, nil
}

// agentLastEnd is the reason of the node agent container's last
// termination as the kubelet reports it.
func (l *load) agentLastEnd(ctx context.Context) (string, error) {
	p, err := l.agentPod(ctx)
	if err != nil {
		return "", err
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != agentContainer {
			continue
		}
		if cs.LastTerminationState.Terminated == nil {
			return "", fmt.Errorf("pod %s: container %s has no last termination (restarts %d)", p.Name, cs.Name, cs.RestartCount)
		}
		return cs.LastTerminationState.Terminated.Reason, nil
	}
	return "", fmt.Errorf("pod %s has no container %s", p.Name, agentContainer)
}
