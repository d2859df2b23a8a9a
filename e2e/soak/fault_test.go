//go:build e2e

package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/layercache/layercache/e2e/framework"
)

const (
	// agentBackBound bounds the wait for a killed agent's new process:
	// the kubelet restarts it after its CrashLoopBackOff delay, which
	// doubles with each kill within 10 minutes (10 s, 20 s, 40 s, ...)
	// up to 5 minutes.
	agentBackBound = 6 * time.Minute
	// agentReadyBound bounds the wait, after its process is back, for the
	// agent's pod to be Ready.
	agentReadyBound = 2 * time.Minute
	// controlPlaneBound bounds control-plane.sh start: etcd 60 s, then
	// kube-apiserver's /readyz 180 s.
	controlPlaneBound = 5 * time.Minute
	// transientBound is how long a call of the test to the API server
	// retries connection errors and 5xx answers: the apiserver fault's
	// outage plus the API server's start.
	transientBound = 5 * time.Minute
	// agentSelector finds the node agent's pod.
	agentSelector = "app.kubernetes.io/name=layercache,app.kubernetes.io/component=node"
)

// faultEvent is one injection of the fault.
type faultEvent struct {
	// At is when the agent was killed, or when the control plane's stop
	// began.
	At time.Time `json:"at"`
	// DuringLoad: phase 2 was still running at At.
	DuringLoad bool `json:"duringLoad"`
	// agent-kill: the killed and the new process.
	OldPID int `json:"oldPID,omitempty"`
	NewPID int `json:"newPID,omitempty"`
	// Back: agent-kill, from the kill until the new agent process runs;
	// apiserver, from the stop until /readyz answers again; node-restart
	// and node-reboot, from the stop until the kubelet's /healthz answers
	// again; registry, from the stop until the registry answers again.
	Back time.Duration `json:"backNanos"`
	// Ready: agent-kill, from the kill until the agent's pod is Ready
	// again with one more restart; node-restart and node-reboot, from the
	// stop until the Node is Ready again with a heartbeat of the new
	// kubelet.
	Ready time.Duration `json:"readyNanos,omitempty"`
	// Stopping: apiserver, node-restart, how long stopping both took;
	// registry, stopping the registry.
	Stopping time.Duration `json:"stoppingNanos,omitempty"`
	// AgentReady: node-reboot, from the reboot until a new agent
	// process runs and its pod is Ready (its startup's Recover and
	// remount are done).
	AgentReady time.Duration `json:"agentReadyNanos,omitempty"`
	// registry: Backlog is the generations node 1 had committed but not
	// published when the registry answered again; Published is from then
	// until all of them were in their Caches' chains.
	Backlog   int64         `json:"backlog,omitempty"`
	Published time.Duration `json:"publishedNanos,omitempty"`
	// agent-oom: the memory limit that made the kernel kill the agent
	// (the agent's usage when it was set), and how the kubelet reported
	// the killed container's end.
	OOMLimit int64 `json:"oomLimit,omitempty"`
	// manager-leader: Killed is the killed leader's identity, NewLeader
	// the next holder of the Lease; Back is from the kill to it.
	NewLeader string `json:"newLeader,omitempty"`
	Killed    string `json:"killed,omitempty"`
	Error     string `json:"error,omitempty"`
}

// faultRun is the fault of one load run and what it did.
type faultRun struct {
	Kind   string       `json:"kind"`
	Events []faultEvent `json:"events"`
	// Note says why the fault did less than asked, if it did.
	Note string `json:"note,omitempty"`
	// Registry is what the registry fault measured after the load.
	Registry *registryFigures `json:"registry,omitempty"`
	done     chan struct{}    // closed when the injection is over
	// started is when the (first) injection began (guarded by load.mu).
	started time.Time
}

// requireHost fails the test unless a fault can be injected here: the
// test signals host processes and runs e2e/cluster/control-plane.sh, so
// it needs root and the local backend's cluster.
func (l *load) requireHost() {
	if os.Geteuid() != 0 {
		l.t.Fatalf("SOAK_FAULT=%s needs root (it signals the cluster's host processes); run as root", l.cfg.Fault)
	}
	if l.f.Cluster.Backend != "local" {
		l.t.Fatalf("SOAK_FAULT=%s needs the local backend (make up CLUSTER=local), not %q: its nodes and control plane are host processes", l.cfg.Fault, l.f.Cluster.Backend)
	}
}

// startFault injects cfg.Fault once phase 2 has started, in the
// background; l.fault.done closes when it is over. A load that ends
// before phase 2 starts gets no fault.
func (l *load) startFault(ctx context.Context) {
	l.fault = &faultRun{Kind: l.cfg.Fault, done: make(chan struct{})}
	// Registered here, not in the injecting goroutine: a cleanup cannot
	// be added once the test is over.
	switch l.cfg.Fault {
	case faultAPIServer:
		l.t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), controlPlaneBound)
			defer cancel()
			if out, err := controlPlane(ctx, "start"); err != nil {
				l.t.Errorf("starting etcd and kube-apiserver again at cleanup: %v\n%s", err, out)
			}
		})
	case faultManagerLeader:
		l.startStandby(ctx)
	case faultRegistry:
		l.startRegistryRun()
	case faultNodeRestart, faultNodeReboot:
		// start after a reboot finds both daemons running, or starts
		// what a failed reboot's kills left recorded by no stop: then it
		// fails, and says how to recover.
		l.t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), nodeDaemonsBound)
			defer cancel()
			if out, err := l.nodeDaemons(ctx, "start"); err != nil {
				l.t.Errorf("starting the node's containerd and kubelet again at cleanup: %v\n%s", err, out)
			}
		})
	}
	go func() {
		defer close(l.fault.done)
		if l.cfg.Fault == faultNone {
			return
		}
		select {
		case <-l.phase2:
		case <-l.loadDone:
			l.fault.Note = "the load ended before phase 2: no fault injected"
			return
		case <-ctx.Done():
			return
		}
		switch l.cfg.Fault {
		case faultAgentKill, faultAgentOOM:
			l.killAgentRepeatedly(ctx)
		case faultAPIServer:
			l.stopControlPlane(ctx)
		case faultNodeRestart, faultNodeReboot:
			l.restartNode(ctx)
		case faultManagerLeader:
			l.killLeader(ctx)
		case faultRegistry:
			l.registryOutage(ctx)
		}
	}()
}

// waitFault waits until the fault is over, and fails the test if no
// injection hit the running load.
func (l *load) waitFault() {
	<-l.fault.done
	if l.cfg.Fault == faultNone || l.t.Failed() {
		return
	}
	hit := false
	for _, ev := range l.fault.Events {
		hit = hit || (ev.DuringLoad && ev.Error == "")
	}
	if !hit {
		l.t.Errorf("the %s fault never hit phase 2 (%d injections, %s): the load was too short for SOAK_FAULT_EVERY %s; raise SOAK_BUILDS",
			l.cfg.Fault, len(l.fault.Events), l.fault.Note, l.cfg.FaultEvery)
	}
}

func (l *load) loadRunning() bool {
	select {
	case <-l.loadDone:
		return false
	default:
		return true
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// killAgentRepeatedly kills the node agent cfg.FaultKills times (a
// SIGKILL for agent-kill, the kernel's OOM killer for agent-oom), each
// FaultEvery after phase 2's start or the previous agent's return.
func (l *load) killAgentRepeatedly(ctx context.Context) {
	for i := range l.cfg.FaultKills {
		if !sleepCtx(ctx, l.cfg.FaultEvery) {
			l.fault.Note = fmt.Sprintf("the test ended after %d kills", i)
			return
		}
		ev := l.killAgent(ctx)
		l.mu.Lock()
		l.fault.Events = append(l.fault.Events, ev)
		l.mu.Unlock()
		if ev.Error != "" {
			l.t.Errorf("%s %d: %s", l.cfg.Fault, i+1, ev.Error)
			return
		}
		l.t.Logf("%s %d: pid %d killed at %s (load running: %v; %s); new pid %d after %s, Ready after %s",
			l.cfg.Fault, i+1, ev.OldPID, ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.Killed, ev.NewPID, ev.Back.Round(time.Millisecond), ev.Ready.Round(time.Millisecond))
	}
}

// killAgent kills the node's agent and waits for its new process and
// for its pod to be Ready again; under agent-oom it also checks that the
// kubelet reports the container OOMKilled.
func (l *load) killAgent(ctx context.Context) faultEvent {
	var ev faultEvent
	old, err := l.waitAgent(ctx, 0, agentBackBound)
	if err != nil {
		ev.Error = fmt.Sprintf("finding the agent to kill: %v", err)
		return ev
	}
	restarts, err := l.agentRestarts(ctx)
	if err != nil {
		ev.Error = fmt.Sprintf("reading the agent pod's restarts: %v", err)
		return ev
	}
	ev.OldPID, ev.At, ev.DuringLoad = old.PID, time.Now(), l.loadRunning()
	switch l.cfg.Fault {
	case faultAgentOOM:
		limit, err := oomKill(ctx, l.t, old.PID)
		ev.OOMLimit = limit
		if err != nil {
			ev.Error = fmt.Sprintf("OOM kill of pid %d: %v", old.PID, err)
			return ev
		}
		// The limit was set when the load began to fail allocations;
		// the kill is when the process went.
		ev.At = time.Now()
	default:
		if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
			ev.Error = fmt.Sprintf("SIGKILL of pid %d: %v", old.PID, err)
			return ev
		}
		ev.Killed = "SIGKILL"
	}
	back, err := l.waitAgent(ctx, old.PID, agentBackBound)
	if err != nil {
		ev.Error = fmt.Sprintf("no new agent process within %s of the kill of pid %d: %v", agentBackBound, old.PID, err)
		return ev
	}
	ev.NewPID, ev.Back = back.PID, time.Since(ev.At)
	if err := l.waitAgentReady(ctx, restarts); err != nil {
		ev.Error = fmt.Sprintf("agent pid %d: %v", back.PID, err)
		return ev
	}
	ev.Ready = time.Since(ev.At)
	if l.cfg.Fault == faultAgentOOM {
		reason, err := l.agentLastEnd(ctx)
		if err != nil {
			ev.Error = fmt.Sprintf("the OOM-killed agent's end as the kubelet reports it: %v", err)
			return ev
		}
		ev.Killed = reason
		if reason != "OOMKilled" {
			ev.Error = fmt.Sprintf("the kubelet reports the killed agent container's end as %q, want OOMKilled", reason)
		}
	}
	return ev
}

// waitAgent polls for the node's agent process other than pid notPID.
func (l *load) waitAgent(ctx context.Context, notPID int, bound time.Duration) (agentProc, error) {
	deadline := time.Now().Add(bound)
	for {
		a, err := findAgent(l.node.Name)
		if err == nil && a.PID != notPID {
			return a, nil
		}
		if err == nil {
			err = fmt.Errorf("pid %d still runs", notPID)
		}
		if time.Now().After(deadline) {
			return agentProc{}, err
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return agentProc{}, ctx.Err()
		}
	}
}

// agentPod is the node agent's pod on the test's node.
func (l *load) agentPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := l.f.Client.CoreV1().Pods(framework.SystemNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: agentSelector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", l.node.Name).String(),
	})
	if err != nil {
		return nil, err
	}
	if len(pods.Items) != 1 {
		return nil, fmt.Errorf("%d node agent pods on node %s, want 1", len(pods.Items), l.node.Name)
	}
	return &pods.Items[0], nil
}

func (l *load) agentRestarts(ctx context.Context) (int32, error) {
	p, err := l.agentPod(ctx)
	if err != nil {
		return 0, err
	}
	var n int32
	for _, cs := range p.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n, nil
}

// waitAgentReady waits until the agent's pod counts more restarts than
// before and is Ready. A redeploy (another engineer's make up) replaces
// the pod: a Ready new pod counts too.
func (l *load) waitAgentReady(ctx context.Context, before int32) error {
	deadline := time.Now().Add(agentReadyBound)
	var last string
	for time.Now().Before(deadline) {
		p, err := l.agentPod(ctx)
		if err != nil {
			last = err.Error()
		} else {
			var n int32
			for _, cs := range p.Status.ContainerStatuses {
				n += cs.RestartCount
			}
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
			}
			if ready && (n > before || n == 0) {
				return nil
			}
			last = fmt.Sprintf("pod %s: ready %v, restarts %d (%d before the kill)", p.Name, ready, n, before)
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("its pod was not Ready again within %s of its return: %s", agentReadyBound, last)
}

// stopControlPlane stops etcd and kube-apiserver FaultEvery after phase
// 2's start, keeps them down FaultDown, and starts them again, even if
// the test is being cancelled: the cluster is shared (startFault also
// registers a start at cleanup).
func (l *load) stopControlPlane(ctx context.Context) {
	if !sleepCtx(ctx, l.cfg.FaultEvery) {
		l.fault.Note = "the test ended before the outage"
		return
	}
	ev := faultEvent{At: time.Now(), DuringLoad: l.loadRunning()}
	record := func() {
		l.mu.Lock()
		l.fault.Events = append(l.fault.Events, ev)
		l.mu.Unlock()
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	out, err := controlPlane(stopCtx, "stop")
	cancel()
	ev.Stopping = time.Since(ev.At)
	l.t.Logf("control-plane.sh stop:\n%s", out)
	if err != nil {
		ev.Error = fmt.Sprintf("control-plane.sh stop: %v", err)
		l.t.Errorf("%s\n%s", ev.Error, out)
	}
	l.t.Logf("apiserver: etcd and kube-apiserver stopped at %s in %s (load running: %v); down for %s",
		ev.At.UTC().Format("15:04:05.000"), ev.Stopping.Round(time.Millisecond), ev.DuringLoad, l.cfg.FaultDown)
	// The outage lasts FaultDown even if the test is being cancelled:
	// the start below must run anyway.
	time.Sleep(l.cfg.FaultDown)
	startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlPlaneBound)
	defer cancel()
	out, err = controlPlane(startCtx, "start")
	ev.Back = time.Since(ev.At)
	l.t.Logf("control-plane.sh start:\n%s", out)
	if err != nil {
		ev.Error = strings.TrimPrefix(ev.Error+"; ", "; ") + fmt.Sprintf("control-plane.sh start: %v", err)
		l.t.Errorf("control-plane.sh start: %v\n%s", err, out)
	}
	record()
	l.t.Logf("apiserver: /readyz again %s after the stop", ev.Back.Round(time.Millisecond))
}

// controlPlane runs e2e/cluster/control-plane.sh VERB on the cluster of
// KUBECONFIG.
func controlPlane(ctx context.Context, verb string) (string, error) {
	return clusterScript(ctx, "control-plane.sh", verb)
}

// clusterScript runs e2e/cluster/SCRIPT ARGS on the cluster of
// KUBECONFIG (its directory is the cluster's, which may belong to
// another checkout than the test's).
func clusterScript(ctx context.Context, script string, args ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		return "", errors.New("KUBECONFIG is not set")
	}
	dir, err := filepath.Abs(filepath.Dir(kubeconfig))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "e2e", "cluster", script), args...)
	cmd.Env = append(os.Environ(), "LAYERCACHE_CLUSTER_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s (cluster %s): %w", script, strings.Join(args, " "), dir, err)
	}
	return string(out), nil
}

// transient reports whether err may be the API server being away (the
// apiserver fault's outage) rather than an answer: no connection, a
// dropped one, or a 5xx or 429 status.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true // refused, reset, EOF, TLS handshake timeout
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

// retryTransient calls fn until it succeeds, fails for good, or
// transientBound passes.
func retryTransient(ctx context.Context, fn func(context.Context) error) error {
	deadline := time.Now().Add(transientBound)
	for {
		err := fn(ctx)
		if !transient(err) || time.Now().After(deadline) {
			return err
		}
		if !sleepCtx(ctx, time.Second) {
			return err
		}
	}
}

// keepPolling is a poll condition's answer to err: a transient error is
// remembered in last and the poll goes on; any other ends it. An error of
// the poll's own end (its deadline, which client-go's rate limiter words
// as its own error) is not remembered: it would hide the API's last one.
func keepPolling(ctx context.Context, err error, last *error) error {
	if ctx.Err() != nil || strings.Contains(err.Error(), "would exceed context deadline") {
		return nil
	}
	if transient(err) {
		*last = err
		return nil
	}
	return err
}

const (
	// nodeDaemonsBound bounds node-daemons.sh stop or start: 20 s per
	// daemon before its KILL, or containerd's 60 s and the kubelet's
	// 120 s to answer.
	nodeDaemonsBound = 4 * time.Minute
	// nodeReadyBound bounds the wait for the Node's Ready condition
	// with a heartbeat of the restarted kubelet.
	nodeReadyBound = 2 * time.Minute
)

// restartNode stops the node's containerd and kubelet FaultEvery after
// phase 2's start and starts them again at once, as a node's daemons are
// restarted (an upgrade, a crash of either): the pods' containers keep
// running under their shims. Under node-reboot it reboots the node
// instead (node-daemons.sh reboot): every process and mount of the node
// gone, its store's files kept; then it also waits for the node agent's
// new process, whose startup remounts the volumes of still-bound PVs. Like
// stopControlPlane, the start runs even if the test is being cancelled.
func (l *load) restartNode(ctx context.Context) {
	if !sleepCtx(ctx, l.cfg.FaultEvery) {
		l.fault.Note = "the test ended before the restart"
		return
	}
	oldAgent, agentErr := findAgent(l.node.Name)
	ev := faultEvent{At: time.Now(), DuringLoad: l.loadRunning(), OldPID: oldAgent.PID}
	l.mu.Lock()
	l.fault.started = ev.At
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.fault.Events = append(l.fault.Events, ev)
		l.mu.Unlock()
	}()
	fail := func(format string, args ...any) { l.failEvent(&ev, format, args...) }
	startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nodeDaemonsBound)
	defer cancel()
	if l.cfg.Fault == faultNodeReboot {
		out, err := l.nodeDaemons(startCtx, "reboot")
		ev.Back = time.Since(ev.At)
		l.t.Logf("node-daemons.sh reboot:\n%s", out)
		if err != nil {
			fail("%v", err)
			return
		}
	} else if !l.stopStartNode(ctx, startCtx, &ev, fail) {
		return
	}
	// The node's process is new: the test enters its namespace through
	// the pid that start wrote to cluster.json.
	c, err := framework.LoadCluster()
	if err != nil {
		fail("reading cluster.json after the restart: %v", err)
		return
	}
	n, err := c.Node(l.node.Name)
	if err != nil {
		fail("%v", err)
		return
	}
	l.mu.Lock()
	l.node = n
	for i := range l.f.Cluster.Nodes {
		if l.f.Cluster.Nodes[i].Name == n.Name {
			l.f.Cluster.Nodes[i] = n
		}
	}
	l.mu.Unlock()
	if err := l.waitNodeReady(startCtx, ev.At.Add(ev.Stopping)); err != nil {
		fail("node %s after the restart: %v", n.Name, err)
		return
	}
	ev.Ready = time.Since(ev.At)
	l.t.Logf("%s: kubelet healthy %s after the stop, Node Ready %s after it", l.cfg.Fault, ev.Back.Round(time.Millisecond), ev.Ready.Round(time.Millisecond))
	if l.cfg.Fault != faultNodeReboot {
		return
	}
	if agentErr != nil {
		fail("the node agent before the reboot: %v", agentErr)
		return
	}
	if err := l.waitAgentBack(startCtx, &ev); err != nil {
		fail("the node agent after the reboot: %v", err)
		return
	}
	l.t.Logf("node-reboot: agent pid %d killed, new pid %d with its pod Ready %s after the reboot", ev.OldPID, ev.NewPID, ev.AgentReady.Round(time.Millisecond))
	// The old kubelet may have scheduled pods until the kill, well into
	// node-daemons.sh reboot (12 s into it on a loaded machine, Nov
	// 2026), so a pod is the old kubelet's if it was scheduled before the
	// new one started.
	if err := l.reapStranded(startCtx, ev.At.Add(ev.Back)); err != nil {
		fail("deleting the pods the reboot stranded: %v", err)
	}
}

const (
	// strandedWait is how long after the agent's return reapStranded
	// looks for stranded pods; strandedSettle how long one must stay so.
	strandedWait   = 40 * time.Second
	strandedSettle = 15 * time.Second
	// exitStranded marks the end reapStranded reports for a pod it
	// deleted.
	exitStranded = "stranded"
)

// reapStranded deletes the build pods that node-reboot stranded and
// reports them ended. Their container was created, not started, when the
// node went down; the new kubelet finds that container in containerd's
// records, and for a pod of restartPolicy Never that had containers it
// makes no new sandbox (kuberuntime_manager.go, computePodActions), so
// it neither runs the pod nor fails it: the pod stays Pending, its
// volumes set up. A CI system's timeout would delete it; the test does
// so at once, and its volume must then be discarded.
func (l *load) reapStranded(ctx context.Context, kubeletBack time.Time) error {
	seen := map[string]time.Time{}
	reaped := map[string]bool{}
	for deadline := time.Now().Add(strandedWait); time.Now().Before(deadline); {
		pods, err := l.f.Client.CoreV1().Pods(l.f.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "soak=build"})
		if err != nil && !transient(err) {
			return err
		}
		var items []corev1.Pod
		if pods != nil {
			items = pods.Items
		}
		for _, p := range items {
			if reaped[p.Name] || !stranded(&p, kubeletBack) {
				delete(seen, p.Name)
				continue
			}
			if _, ok := seen[p.Name]; !ok {
				seen[p.Name] = time.Now()
			}
			if time.Since(seen[p.Name]) < strandedSettle {
				continue
			}
			l.t.Logf("node-reboot: pod %s stranded (Pending, its container created before the reboot and never started): deleting it", p.Name)
			err := l.f.Client.CoreV1().Pods(l.f.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting pod %s: %w", p.Name, err)
			}
			reaped[p.Name] = true
			l.endsIn <- endNote{name: p.Name, phase: p.Status.Phase, at: time.Now(), exit: exitStranded}
		}
		if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
	}
	return nil
}

// stranded tells a pod that the old kubelet had (scheduled before the
// new one started, at kubeletBack) and that is Pending with its
// containers waiting. Two kinds were seen: its container created before
// the reboot (the status has its ID; computePodActions, above), and one
// whose volume's set-up failed while the agent was away (FailedMount: its
// gate link gone with the reboot; the status without a container ID). A
// pod that only waited for its turn starts within seconds of the agent's
// return, well within strandedSettle.
func stranded(p *corev1.Pod, kubeletBack time.Time) bool {
	if p.Status.Phase != corev1.PodPending || len(p.Status.ContainerStatuses) == 0 || !scheduledBefore(p, kubeletBack) {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Waiting == nil {
			return false
		}
	}
	return true
}

func scheduledBefore(p *corev1.Pod, t time.Time) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time.Before(t)
		}
	}
	return false
}

// stopStartNode is node-restart's stop and start of the node's daemons.
func (l *load) stopStartNode(ctx, startCtx context.Context, ev *faultEvent, fail func(string, ...any)) bool {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nodeDaemonsBound)
	out, err := l.nodeDaemons(stopCtx, "stop")
	cancel()
	ev.Stopping = time.Since(ev.At)
	l.t.Logf("node-daemons.sh stop:\n%s", out)
	if err != nil {
		fail("%v", err)
	}
	l.t.Logf("node-restart: containerd and the kubelet stopped at %s in %s (load running: %v)",
		ev.At.UTC().Format("15:04:05.000"), ev.Stopping.Round(time.Millisecond), ev.DuringLoad)
	out, err = l.nodeDaemons(startCtx, "start")
	ev.Back = time.Since(ev.At)
	l.t.Logf("node-daemons.sh start:\n%s", out)
	if err != nil {
		fail("%v", err)
		return false
	}
	return true
}

// waitAgentBack waits for the rebooted node's new agent process and for
// its pod to turn Ready after the reboot: until the new kubelet reports
// it, the pod shows its Ready condition of before the reboot.
func (l *load) waitAgentBack(ctx context.Context, ev *faultEvent) error {
	back, err := l.waitAgent(ctx, ev.OldPID, agentBackBound)
	if err != nil {
		return fmt.Errorf("no new process within %s: %w", agentBackBound, err)
	}
	ev.NewPID = back.PID
	deadline := time.Now().Add(agentReadyBound)
	last := "not read yet"
	for time.Now().Before(deadline) {
		p, err := l.agentPod(ctx)
		if err != nil {
			last = err.Error()
		} else {
			for _, c := range p.Status.Conditions {
				if c.Type != corev1.PodReady {
					continue
				}
				last = fmt.Sprintf("pod %s Ready %s since %s", p.Name, c.Status, c.LastTransitionTime.UTC().Format(time.TimeOnly))
				// Transition times have second precision.
				if c.Status == corev1.ConditionTrue && !c.LastTransitionTime.Time.Before(ev.At.Truncate(time.Second)) {
					ev.AgentReady = time.Since(ev.At)
					return nil
				}
			}
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("pid %d: its pod did not turn Ready within %s: %s; %s", back.PID, agentReadyBound, last, l.agentLogTail(ctx))
}

// agentLogTail returns the last lines the agent's current and previous
// containers logged: why an agent that does not turn Ready stopped.
func (l *load) agentLogTail(ctx context.Context) string {
	p, err := l.agentPod(ctx)
	if err != nil {
		return "no logs: " + err.Error()
	}
	tail := int64(15)
	var parts []string
	for _, previous := range []bool{true, false} {
		opts := &corev1.PodLogOptions{Previous: previous, TailLines: &tail}
		b, err := l.f.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).DoRaw(ctx)
		if err != nil {
			b = []byte(err.Error())
		}
		parts = append(parts, fmt.Sprintf("logs of %s (previous %t):\n%s", p.Name, previous, b))
	}
	return strings.Join(parts, "\n")
}

// failEvent fails the test and adds the failure to ev's error.
func (l *load) failEvent(ev *faultEvent, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	ev.Error = strings.TrimPrefix(ev.Error+"; "+msg, "; ")
	l.t.Error(msg)
}

// waitNodeReady waits until the Node is Ready with a heartbeat after
// since (the new kubelet's).
func (l *load) waitNodeReady(ctx context.Context, since time.Time) error {
	deadline := time.Now().Add(nodeReadyBound)
	last := "not read yet"
	for time.Now().Before(deadline) {
		node, err := l.f.Client.CoreV1().Nodes().Get(ctx, l.node.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
		} else {
			for _, c := range node.Status.Conditions {
				if c.Type != corev1.NodeReady {
					continue
				}
				last = fmt.Sprintf("Ready %s, last heartbeat %s", c.Status, c.LastHeartbeatTime.UTC().Format(time.TimeOnly))
				// Heartbeats have second precision.
				if c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
					return nil
				}
			}
		}
		if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("not Ready with a new heartbeat within %s: %s", nodeReadyBound, last)
}

// nodeDaemons runs e2e/cluster/node-daemons.sh VERB N for the test's
// node on the cluster of KUBECONFIG.
func (l *load) nodeDaemons(ctx context.Context, verb string) (string, error) {
	num, err := nodeNumber(l.node.Name)
	if err != nil {
		return "", err
	}
	return clusterScript(ctx, "node-daemons.sh", verb, strconv.Itoa(num))
}

// nodeNumber is N of the local cluster's node layercache-nodeN.
func nodeNumber(name string) (int, error) {
	s, ok := strings.CutPrefix(name, "layercache-node")
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 1 {
		return 0, fmt.Errorf("node %q is not one of the local cluster's (layercache-nodeN)", name)
	}
	return n, nil
}

const (
	// quietWindow is how long checkQuiet watches the cluster once
	// everything of the test is gone.
	quietWindow = 10 * time.Second
	// quietWrites and quietEvents bound what may happen in quietWindow:
	// the agent's and manager's periodic writes (reports, leases) fit,
	// a loop retrying a lost volume or mount does not.
	quietWrites = 30
	quietEvents = 5
)

// checkQuiet fails the test if, once the fault is over and every pod,
// claim and PV of the test has gone, the node agent and the manager keep
// writing to the API server, or Events about the test's objects keep
// coming: a write or Event storm the fault left behind.
func (l *load) checkQuiet(ctx context.Context) {
	before, err := l.scrapeMetrics(ctx)
	if err != nil {
		l.t.Logf("quiet check: API writes unavailable: %v", err)
	}
	eventsBefore, err := l.testEvents(ctx)
	if err != nil {
		l.t.Errorf("quiet check: %v", err)
		return
	}
	if !sleepCtx(ctx, quietWindow) {
		return
	}
	eventsAfter, err := l.testEvents(ctx)
	if err != nil {
		l.t.Errorf("quiet check: %v", err)
		return
	}
	if n := eventsAfter - eventsBefore; n > quietEvents {
		l.t.Errorf("%d Events about the test's objects in the %s after its end, over %d: an Event storm", n, quietWindow, quietEvents)
	}
	if before == nil {
		return
	}
	after, err := l.scrapeMetrics(ctx)
	if err == nil {
		var d map[string]map[string]float64
		if d, err = diffWrites(before.writes, after.writes); err == nil {
			l.quietWrites = d
		}
	}
	if err != nil {
		l.t.Logf("quiet check: API writes unavailable: %v", err)
		return
	}
	for comp, byMethod := range l.quietWrites {
		var sum float64
		for _, v := range byMethod {
			sum += v
		}
		if sum > quietWrites {
			l.t.Errorf("%s made %g API writes in the %s after the test's end (%v), over %d: a write storm", comp, sum, quietWindow, byMethod, quietWrites)
		}
	}
}

// testEvents counts the Events (with their repeats) about the test's
// namespace and its PVs.
func (l *load) testEvents(ctx context.Context) (int, error) {
	var n int
	err := retryTransient(ctx, func(ctx context.Context) error {
		n = 0
		nsEvents, err := l.f.Client.CoreV1().Events(l.f.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		pvEvents, err := l.f.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.kind", "PersistentVolume").String(),
		})
		if err != nil {
			return err
		}
		l.mu.Lock()
		ours := map[string]bool{}
		for _, pv := range l.pvByClaim {
			ours[pv] = true
		}
		l.mu.Unlock()
		for _, ev := range append(nsEvents.Items, pvEvents.Items...) {
			if ev.Namespace == l.f.Namespace || ours[ev.InvolvedObject.Name] {
				n += int(max(ev.Count, 1))
				if ev.Series != nil {
					n += int(ev.Series.Count)
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("listing the test's Events: %w", err)
	}
	return n, nil
}
