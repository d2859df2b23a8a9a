//go:build scale

package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// component is a layercache process with its metrics endpoint.
type component struct {
	*process
	metricsURL string
}

// startManager runs `layercache manager` against the control plane, as
// the admin (the generated RBAC is the envtest suite's to check), without
// leader election.
func startManager(ctx context.Context, t *testing.T, cp *controlPlane, logDir, bin string) *component {
	t.Helper()
	metricsAddr, healthAddr := addresses(t)
	p := startProcess(t, logDir, "manager", bin, "manager",
		"--kubeconfig", cp.kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr)
	if err := p.waitHTTP(ctx, "http://"+healthAddr+"/readyz", time.Minute); err != nil {
		t.Fatal(err)
	}
	return &component{process: p, metricsURL: "http://" + metricsAddr + "/metrics"}
}

// startAgent runs `layercache node` for agentNode against the control
// plane, with its store in a temp dir under /var/tmp (overlay needs a
// real filesystem, and /tmp may be a tmpfs). It needs root.
func startAgent(ctx context.Context, t *testing.T, cp *controlPlane, logDir, bin string) *component {
	t.Helper()
	if err := cp.c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: agentNode,
		Labels:      map[string]string{corev1.LabelHostname: agentNode, "type": "kwok"},
		Annotations: map[string]string{kwokAnnotation: "fake"}}}); err != nil {
		t.Fatalf("creating Node %s: %v", agentNode, err)
	}
	const agentNamespace = "layercache-system"
	if err := cp.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}); err != nil {
		t.Fatalf("creating namespace %s: %v", agentNamespace, err)
	}
	root, err := os.MkdirTemp("/var/tmp", "layercache-scale-")
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the process's own cleanup, so it runs after the
	// agent has stopped: unmount what it left, then remove the store.
	t.Cleanup(func() {
		if err := unmountUnder(root); err != nil {
			t.Errorf("unmounting the agent's store %s: %v", root, err)
			return
		}
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("removing the agent's store: %v", err)
		}
	})
	metricsAddr, healthAddr := addresses(t)
	p := startProcess(t, logDir, "node-agent", bin, "node",
		"--kubeconfig", cp.kubeconfig, "--node-name", agentNode, "--root", root, "--namespace", agentNamespace,
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr)
	if err := p.waitHTTP(ctx, "http://"+healthAddr+"/readyz", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return &component{process: p, metricsURL: "http://" + metricsAddr + "/metrics"}
}

// addresses returns two free loopback addresses: metrics and health.
func addresses(t *testing.T) (string, string) {
	t.Helper()
	a, err := freeAddress()
	if err != nil {
		t.Fatal(err)
	}
	b, err := freeAddress()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// scrape reads the component's metrics.
func (c *component) scrape(ctx context.Context) (metrics, error) {
	if err := c.exited(); err != nil {
		return nil, err
	}
	return scrape(ctx, c.metricsURL)
}

// settle waits d for the component to finish starting, then returns its
// memory.
func (c *component) settle(ctx context.Context, t *testing.T, d time.Duration) memory {
	t.Helper()
	if err := sleep(ctx, d); err != nil {
		t.Fatal(err)
	}
	m, err := c.memory()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// meanRSS samples the component's RSS every 2 s until ctx ends and
// returns the mean in MiB (0 if no sample was taken).
func (c *component) meanRSS(ctx context.Context) float64 {
	var total float64
	var n int
	_ = wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(context.Context) (bool, error) {
		if m, err := c.memory(); err == nil {
			total += mib(m.RSS)
			n++
		}
		return false, nil
	})
	if n == 0 {
		return 0
	}
	return total / float64(n)
}

// kwokBinary returns kwok: SCALE_KWOK_BIN, or bin/kwok of the tree (make
// bin/kwok builds it from hack/tools/kwok).
func kwokBinary(repo string) (string, error) {
	bin := os.Getenv("SCALE_KWOK_BIN")
	if bin == "" {
		bin = filepath.Join(repo, "bin", "kwok")
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no kwok at %s (%w): run `make %s/bin/kwok` (or make test-scale, which builds it), or set SCALE_KWOK_BIN", bin, err, repo)
	}
	return bin, nil
}

// startKwok runs kwok out of cluster: it makes the Nodes annotated
// kwokAnnotation=fake Ready and their Pods Running, with the stages of
// stages (no heartbeats, no node leases).
func startKwok(t *testing.T, logDir, bin, kubeconfig, stages string) {
	t.Helper()
	serverAddr, err := freeAddress()
	if err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, logDir, "kwok", bin, "--kubeconfig", kubeconfig, "--config", stages,
		"--manage-nodes-with-annotation-selector", kwokAnnotation+"=fake",
		"--node-lease-duration-seconds", "0", "--server-address", serverAddr)
	// kwok has no readiness endpoint of its own to wait on; give it a
	// moment to fail on a bad flag or config.
	time.Sleep(time.Second)
	if err := p.exited(); err != nil {
		t.Fatal(err)
	}
}

// unmountUnder lazily unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		mp := fields[4]
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			return fmt.Errorf("unmounting %s: %w", points[i], err)
		}
	}
	return nil
}
