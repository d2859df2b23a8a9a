//go:build e2e

package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

const (
	managerDeployment = "layercache-manager"
	// standbyDeployment is the test's second manager (see startStandby).
	standbyDeployment = "layercache-manager-standby"
	standbyLabel      = "layercache.dev/e2e-standby"
	// managerLease is the leader Lease (cachemanager.Options'
	// LeaderElectionID, in the manager's namespace).
	managerLease = "layercache-manager.layercache.dev"
	// standbyPortOffset moves the standby's host ports (the e2e overlay
	// runs the manager with hostNetwork) off the first manager's.
	standbyPortOffset = 10000
	// standbyBound bounds the standby's start (a pod Ready) and its
	// removal.
	standbyBound = 3 * time.Minute
	// takeoverBound bounds the wait for a new leader after the SIGKILL:
	// the Lease (15 s) must expire first, as a killed leader cannot
	// release it.
	takeoverBound = 2 * time.Minute
	// standaloneEvery: under manager-leader, every standaloneEvery-th
	// build of phase 2 uses a standalone claim released on pod exit,
	// which only the manager releases.
	standaloneEvery = 4
)

// startStandby makes the manager two replicas for the manager-leader
// fault and waits until the second is Ready; a cleanup removes it. The
// e2e overlay runs the manager with hostNetwork on the one node, so a
// second replica of its Deployment could not bind its ports: the second
// is a copy of the Deployment (same image, service account, leader Lease)
// with its metrics and health ports moved by standbyPortOffset.
func (l *load) startStandby(ctx context.Context) {
	deps := l.f.Client.AppsV1().Deployments(framework.SystemNamespace)
	orig, err := deps.Get(ctx, managerDeployment, metav1.GetOptions{})
	if err != nil {
		l.t.Fatalf("SOAK_FAULT=%s: the manager's Deployment: %v", l.cfg.Fault, err)
	}
	d, err := standbyOf(orig)
	if err != nil {
		l.t.Fatalf("SOAK_FAULT=%s: %v", l.cfg.Fault, err)
	}
	l.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), standbyBound)
		defer cancel()
		if err := l.removeStandby(ctx); err != nil {
			l.t.Errorf("removing the standby manager: %v", err)
		}
	})
	if _, err := deps.Create(ctx, d, metav1.CreateOptions{}); err != nil {
		l.t.Fatalf("SOAK_FAULT=%s: creating the standby manager: %v", l.cfg.Fault, err)
	}
	deadline := time.Now().Add(standbyBound)
	last := "no pod yet"
	for time.Now().Before(deadline) {
		pods, err := l.managerPods(ctx)
		if err != nil {
			last = err.Error()
		} else {
			ready := 0
			for _, p := range pods {
				if podReady(&p) {
					ready++
				}
			}
			if ready >= 2 {
				l.t.Logf("manager-leader: %d manager pods Ready", ready)
				return
			}
			last = fmt.Sprintf("%d of %d manager pods Ready", ready, len(pods))
		}
		if !sleepCtx(ctx, time.Second) {
			break
		}
	}
	l.t.Fatalf("SOAK_FAULT=%s: the standby manager was not Ready within %s: %s", l.cfg.Fault, standbyBound, last)
}

// standbyOf is the standby copy of the manager's Deployment: one replica,
// its own label in its selector, its host ports moved.
func standbyOf(orig *appsv1.Deployment) (*appsv1.Deployment, error) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{
		Name: standbyDeployment, Namespace: orig.Namespace, Labels: orig.Labels,
	}}
	d.Spec = *orig.Spec.DeepCopy()
	d.Spec.Replicas = new(int32(1))
	sel := d.Spec.Selector.DeepCopy()
	sel.MatchLabels = map[string]string{standbyLabel: "true"}
	for k, v := range orig.Spec.Selector.MatchLabels {
		sel.MatchLabels[k] = v
	}
	d.Spec.Selector = sel
	d.Spec.Template.Labels = map[string]string{}
	for k, v := range orig.Spec.Template.Labels {
		d.Spec.Template.Labels[k] = v
	}
	d.Spec.Template.Labels[standbyLabel] = "true"
	if len(d.Spec.Template.Spec.Containers) != 1 {
		return nil, fmt.Errorf("the manager's Deployment has %d containers, want 1", len(d.Spec.Template.Spec.Containers))
	}
	c := &d.Spec.Template.Spec.Containers[0]
	moved := 0
	for i, a := range c.Args {
		for _, flag := range []string{"--metrics-bind-address=", "--health-probe-bind-address="} {
			v, ok := strings.CutPrefix(a, flag)
			if !ok {
				continue
			}
			host, port, ok := strings.Cut(v, ":")
			p, err := strconv.Atoi(port)
			if !ok || err != nil {
				return nil, fmt.Errorf("manager argument %q: want HOST:PORT", a)
			}
			c.Args[i] = fmt.Sprintf("%s%s:%d", flag, host, p+standbyPortOffset)
			moved++
		}
	}
	if moved != 2 {
		return nil, fmt.Errorf("the manager's arguments %q: found %d of --metrics-bind-address and --health-probe-bind-address, want both", c.Args, moved)
	}
	for i := range c.Ports {
		c.Ports[i].ContainerPort += standbyPortOffset
		if c.Ports[i].HostPort != 0 {
			c.Ports[i].HostPort += standbyPortOffset
		}
	}
	return d, nil
}

// removeStandby deletes the standby and waits until its pods are gone.
func (l *load) removeStandby(ctx context.Context) error {
	err := retryTransient(ctx, func(ctx context.Context) error {
		return l.f.Client.AppsV1().Deployments(framework.SystemNamespace).Delete(ctx, standbyDeployment,
			metav1.DeleteOptions{PropagationPolicy: new(metav1.DeletePropagationForeground)})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	for {
		pods, err := l.f.Client.CoreV1().Pods(framework.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: standbyLabel + "=true"})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		if !sleepCtx(ctx, time.Second) {
			return fmt.Errorf("standby manager pods still there: %v (last error %v)", ctx.Err(), err)
		}
	}
}

func (l *load) managerPods(ctx context.Context) ([]corev1.Pod, error) {
	pods, err := l.f.Client.CoreV1().Pods(framework.SystemNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=layercache,app.kubernetes.io/component=" + framework.ComponentManager,
	})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return p.DeletionTimestamp == nil
		}
	}
	return false
}

// leader is the manager Lease's holder: controller-runtime's identity,
// POD_UUID.
func (l *load) leader(ctx context.Context) (string, error) {
	lease, err := l.f.Client.CoordinationV1().Leases(framework.SystemNamespace).Get(ctx, managerLease, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return "", nil
	}
	return *lease.Spec.HolderIdentity, nil
}

// killLeader SIGKILLs the leading manager's process FaultEvery after
// phase 2's start and waits until another identity holds the Lease.
func (l *load) killLeader(ctx context.Context) {
	if !sleepCtx(ctx, l.cfg.FaultEvery) {
		l.fault.Note = "the test ended before the kill"
		return
	}
	ev := faultEvent{DuringLoad: l.loadRunning()}
	defer func() {
		l.mu.Lock()
		l.fault.Events = append(l.fault.Events, ev)
		l.mu.Unlock()
		if ev.Error != "" {
			l.t.Errorf("manager-leader: %s", ev.Error)
		}
	}()
	holder, err := l.leader(ctx)
	if err != nil || holder == "" {
		ev.Error = fmt.Sprintf("reading the leader Lease %s: holder %q, %v", managerLease, holder, err)
		return
	}
	// The identity is HOSTNAME_UUID, and with hostNetwork both replicas'
	// hostname is the node's: the leader is the pod whose metrics say so.
	podName, err := l.leaderPod(ctx)
	if err != nil {
		ev.Error = fmt.Sprintf("the leader %s's pod: %v", holder, err)
		return
	}
	pod, err := l.f.Client.CoreV1().Pods(framework.SystemNamespace).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		ev.Error = fmt.Sprintf("the leader %s's pod %s: %v", holder, podName, err)
		return
	}
	if len(pod.Status.ContainerStatuses) != 1 {
		ev.Error = fmt.Sprintf("the leader's pod %s has %d container statuses, want 1", podName, len(pod.Status.ContainerStatuses))
		return
	}
	_, id, _ := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
	pid, err := findContainerProcess(id, "manager")
	if err != nil {
		ev.Error = fmt.Sprintf("the leader's process (pod %s): %v", podName, err)
		return
	}
	ev.OldPID, ev.Killed = pid, podName+" ("+holder+")"
	ev.At = time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		ev.Error = fmt.Sprintf("SIGKILL of the leader's pid %d: %v", pid, err)
		return
	}
	deadline := ev.At.Add(takeoverBound)
	for {
		h, err := l.leader(ctx)
		if err == nil && h != "" && h != holder {
			ev.Back, ev.NewLeader = time.Since(ev.At), h
			break
		}
		if time.Now().After(deadline) {
			ev.Error = fmt.Sprintf("no new leader within %s of the SIGKILL of %s (pid %d): holder %q, %v", takeoverBound, holder, pid, h, err)
			return
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			ev.Error = ctx.Err().Error()
			return
		}
	}
	// Which pod leads now: the other, or the killed one's new process.
	for range 20 {
		if p, err := l.leaderPod(ctx); err == nil {
			ev.NewLeader = p + " (" + ev.NewLeader + ")"
			break
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			break
		}
	}
	l.t.Logf("manager-leader: %s (pid %d) SIGKILLed at %s (load running: %v); %s leads %s later",
		ev.Killed, pid, ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.NewLeader, ev.Back.Round(time.Millisecond))
}

// leaderPod is the manager pod whose controller-runtime metrics report it
// the leader of managerLease (leader_election_master_status 1).
func (l *load) leaderPod(ctx context.Context) (string, error) {
	pages, err := l.f.ComponentMetrics(ctx, framework.ComponentManager, "")
	if err != nil {
		return "", err
	}
	want := `leader_election_master_status{name="` + managerLease + `"} 1`
	var leaders []string
	for pod, page := range pages {
		for line := range strings.Lines(page) {
			if strings.TrimSpace(line) == want {
				leaders = append(leaders, pod)
			}
		}
	}
	if len(leaders) != 1 {
		return "", fmt.Errorf("%d manager pods of %d report %s, want 1: %v", len(leaders), len(pages), want, leaders)
	}
	return leaders[0], nil
}

// findContainerProcess is the host pid of the process of container id
// (its cgroup path names the id) whose command line is `layercache ARG1
// ...`.
func findContainerProcess(id, arg1 string) (int, error) {
	if id == "" {
		return 0, fmt.Errorf("no container id")
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), id) {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) >= 2 && filepath.Base(args[0]) == "layercache" && args[1] == arg1 {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("%d processes `layercache %s` in container %s, want 1", len(found), arg1, id)
	}
	return found[0], nil
}

// standaloneClaim is build b's claim under manager-leader: a standalone
// PVC released on pod exit, named as the ephemeral claim would be, so
// that its end Event is found the same way.
func (l *load) standaloneClaim(b *build) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:   b.Name + "-" + volumeName,
			Labels: map[string]string{"soak": "build"},
			Annotations: map[string]string{
				v1alpha1.AnnotationCache:   b.Cache,
				v1alpha1.AnnotationRelease: v1alpha1.ReleaseOnPodExit,
			},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: new(v1alpha1.StorageClassName),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse("1Gi"),
			}},
		},
	}
}
