//go:build e2e && multinode && faults

package multinode

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAgentKilledDuringALazyBuild: a build on node B reads a cache that
// B mounted before its bytes were there (through a proxy of the
// registry slowed to 1 MiB/s a connection, so that B's copy fills over
// about 16 s), and B's node agent is SIGKILLed while the build reads.
// The lazyfs sidecar keeps the layer's mount: the build's reads wait for
// the restarted agent and go on, the build succeeds with A's files
// intact, and its changes are committed and published.
func TestAgentKilledDuringALazyBuild(t *testing.T) {
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	proxy := startProxy(t, e.Reg.Address)
	class := e.newClass(ctx, "kill-proxy", map[string]string{
		"registry": proxy.addr + "/caches", "registrySecret": e.proxySecret(ctx, proxy.addr),
	})
	write := `mkdir -p /cache/data; for i in $(seq 64); do head -c 1048576 /dev/urandom > /cache/data/$i; done
echo hello > /cache/small.txt; cd /cache/data && md5sum * | md5sum | cut -d' ' -f1 > /cache/sums`
	e.run(ctx, e.buildPod("write", a, "killed", class, write))
	e.waitPublished(ctx, "killed", 1)

	proxy.rate.Store(1 << 20)
	build := e.buildPod("build", b, "killed", class, `cat /cache/small.txt > /dev/null; sleep 3
cd /cache/data && md5sum * | md5sum | cut -d' ' -f1; cat /cache/sums; echo built > /cache/out`)
	if _, err := e.CreatePod(ctx, build); err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitForPodPhase(ctx, build.Name, corev1.PodRunning); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // into the reads of files not fetched yet
	killedAt := time.Now()
	k := e.killAgent(ctx, b, "killed")
	t.Logf("killed %s's agent %s while the build read", b, k.pid)

	out := e.waitSucceeded(ctx, build.Name)
	if sums := strings.Fields(out); len(sums) != 2 || sums[0] != sums[1] {
		t.Errorf("the build on %s across its agent's kill read checksums %q, want A's twice", b, sums)
	}
	pod, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, build.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := pod.Status.ContainerStatuses; len(st) != 1 || st[0].State.Terminated == nil || !st[0].State.Terminated.FinishedAt.After(killedAt) {
		t.Fatalf("the build did not run across the kill (its container: %+v); the scenario needs it reading when the agent dies", st)
	}
	e.waitPublished(ctx, "killed", 2)
	out = e.run(ctx, e.buildPod("check", a, "killed", class, "cat /cache/out"))
	if strings.TrimSpace(out) != "built" {
		t.Errorf("node %s after the build on %s: out = %q, want the build's commit", a, b, out)
	}
	e.expectNoTemp(ctx, b)
}
