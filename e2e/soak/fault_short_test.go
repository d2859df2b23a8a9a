//go:build e2e && faults

package soak

import (
	"path/filepath"
	"testing"
	"time"
)

// The short fault tests disturb the whole node (the agent is killed) or
// the whole cluster (the control plane is stopped): they must run alone,
// never beside another test or package. Hence the build tag faults, which
// `go test -tags e2e ./e2e/...` (make e2e, whose packages run side by
// side) leaves out; `make soak-faults` runs them one after the other on
// an otherwise idle cluster. Neither is t.Parallel.

// TestLoadAgentKilled is the short load with the node agent SIGKILLed
// twice during phase 2: every build still ends as decided, committed or
// discarded exactly once, and nothing is left.
func TestLoadAgentKilled(t *testing.T) {
	runLoad(t, shortFault(t, faultAgentKill))
}

// TestLoadAgentOOM is the short load with the node agent killed twice
// by the kernel's OOM killer (its cgroup's memory limit lowered to its
// usage, then restored) during phase 2, with the same checks; the
// kubelet must report the container OOMKilled.
func TestLoadAgentOOM(t *testing.T) {
	runLoad(t, shortFault(t, faultAgentOOM))
}

// TestLoadAPIServerDown is the short load with etcd and kube-apiserver
// stopped for 10 s during phase 2, with the same checks. The outage is
// shorter than make soak's (SOAK_FAULT_DOWN, 30 s) because the rest of
// the run is already long: the API server takes about 20 s to stop, and
// after its return the manager (which exits without the API server)
// comes back through its CrashLoopBackOff and the kubelet retries what
// it missed.
func TestLoadAPIServerDown(t *testing.T) {
	cfg := shortFault(t, faultAPIServer)
	cfg.FaultDown = 10 * time.Second
	runLoad(t, cfg)
}

// TestLoadNodeRestart is the short load with the node's kubelet and
// containerd stopped and started again during phase 2 (the containers
// keep running under their shims), with the same checks.
func TestLoadNodeRestart(t *testing.T) {
	runLoad(t, shortFault(t, faultNodeRestart))
}

// TestLoadNodeReboot is the short load with the node rebooted during
// phase 2 (e2e/cluster/node-daemons.sh reboot): its agent, kubelet,
// containerd, shims and containers SIGKILLed, every mount of the node
// gone (the store's overlays unmounted on the host too), the store's
// files kept; then containerd and the kubelet start in a new mount
// namespace and the agent's startup remounts the volumes of still-bound
// PVs. The builds the reboot killed must end Failed and be discarded;
// the others as decided; with the same checks. The kernel is not
// rebooted: its boot id stays, so layerfs's torn-volume path (volatile
// overlays after a lost page cache) does not fire here; its own tests
// cover it.
func TestLoadNodeReboot(t *testing.T) {
	runLoad(t, shortFault(t, faultNodeReboot))
}

// TestLoadManagerLeader is the short load with the manager as two
// replicas and its leader SIGKILLed during phase 2, while a quarter of
// phase 2's builds use standalone claims released on pod exit (the
// manager's duty), with the same checks.
func TestLoadManagerLeader(t *testing.T) {
	runLoad(t, shortFault(t, faultManagerLeader))
}

// TestLoadRegistryDown is the short load on a two-node cluster (`make up
// NODES=2`; it fails on fewer) with the registry stopped for 10 s during
// phase 2: node 1's builds commit through the outage, then everything is
// published, node 2 reads the same files, and the namespace is quiet for
// 30 s. It stops the registry, so it runs alone, after e2e/multinode.
func TestLoadRegistryDown(t *testing.T) {
	cfg := shortFault(t, faultRegistry)
	cfg.FaultDown, cfg.QuietWatch = 10*time.Second, 30*time.Second
	runLoad(t, cfg)
}

// shortFault is the short load's config (SOAK_* still apply: seed,
// sizes, output) under fault, with the first injection 5 s into phase 2
// so that it lands while the builds run, and two kills (the first
// restart is immediate, the second waits out a 10 s CrashLoopBackOff). Its report goes
// to SOAK_OUTPUT/short, apart from make soak's.
func shortFault(t *testing.T, fault string) config {
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.setFault(fault); err != nil {
		t.Fatal(err)
	}
	cfg.FaultKills, cfg.FaultEvery = 2, 5*time.Second
	// The bound of phases 1 and 2, not their expected time (about a
	// minute): the agent's CrashLoopBackOff and the kubelet's mount
	// retries can stretch them.
	cfg.Duration = max(cfg.Duration, 10*time.Minute)
	cfg.Output = filepath.Join(cfg.Output, "short")
	return cfg
}
