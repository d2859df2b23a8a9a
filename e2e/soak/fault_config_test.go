//go:build e2e

package soak

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestFaultConfig checks the SOAK_FAULT* variables and what they imply;
// it needs no cluster.
func TestFaultConfig(t *testing.T) {
	def := config{Fault: faultNone, Volume: "both", FaultKills: 3, FaultEvery: 20 * time.Second, FaultDown: 30 * time.Second, QuietWatch: 3 * time.Minute}
	with := func(change func(*config)) config {
		c := def
		change(&c)
		return c
	}
	for _, tc := range []struct {
		env     map[string]string
		want    config
		wantErr string
	}{
		{env: nil, want: def},
		{env: map[string]string{"SOAK_FAULT": "agent-kill", "SOAK_FAULT_KILLS": "5", "SOAK_FAULT_EVERY": "7s"},
			want: with(func(c *config) { c.Fault, c.FaultKills, c.FaultEvery = faultAgentKill, 5, 7*time.Second })},
		{env: map[string]string{"SOAK_FAULT": "apiserver", "SOAK_FAULT_DOWN": "1m"},
			want: with(func(c *config) { c.Fault, c.FaultDown = faultAPIServer, time.Minute })},
		{env: map[string]string{"SOAK_FAULT": "agent-oom", "SOAK_FAULT_KILLS": "2"},
			want: with(func(c *config) { c.Fault, c.FaultKills = faultAgentOOM, 2 })},
		// The registry's caches refuse CSI inline volumes: claims only.
		{env: map[string]string{"SOAK_FAULT": "registry", "SOAK_FAULT_DOWN": "10s", "SOAK_QUIET_WATCH": "30s"},
			want: with(func(c *config) {
				c.Fault, c.Volume, c.FaultDown, c.QuietWatch = faultRegistry, "claim", 10*time.Second, 30*time.Second
			})},
		{env: map[string]string{"SOAK_FAULT": "registry", "SOAK_VOLUME": "claim"},
			want: with(func(c *config) { c.Fault, c.Volume = faultRegistry, "claim" })},
		{env: map[string]string{"SOAK_FAULT": "registry", "SOAK_VOLUME": "both"}, wantErr: "claims only"},
		{env: map[string]string{"SOAK_FAULT": "node-reboot"},
			want: with(func(c *config) { c.Fault = faultNodeReboot })},
		{env: map[string]string{"SOAK_FAULT": "reboot"}, wantErr: "SOAK_FAULT"},
		{env: map[string]string{"SOAK_FAULT_KILLS": "0"}, wantErr: "SOAK_FAULT_KILLS"},
		{env: map[string]string{"SOAK_FAULT_DOWN": "-3s"}, wantErr: "SOAK_FAULT_DOWN"},
		{env: map[string]string{"SOAK_QUIET_WATCH": "soon"}, wantErr: "SOAK_QUIET_WATCH"},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			for _, k := range []string{"SOAK_FAULT", "SOAK_FAULT_KILLS", "SOAK_FAULT_EVERY", "SOAK_FAULT_DOWN", "SOAK_QUIET_WATCH", "SOAK_VOLUME"} {
				t.Setenv(k, tc.env[k])
			}
			c, err := loadConfig()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := config{Fault: c.Fault, Volume: c.Volume, FaultKills: c.FaultKills, FaultEvery: c.FaultEvery, FaultDown: c.FaultDown, QuietWatch: c.QuietWatch}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestTransient checks which errors the test retries through an outage.
func TestTransient(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("creating pod: %w", syscall.ECONNREFUSED), true},
		{errors.New("http2: client connection lost"), true},
		{apierrors.NewServiceUnavailable("etcd"), true},
		{apierrors.NewInternalError(errors.New("etcdserver: request timed out")), true},
		{apierrors.NewNotFound(gr, "p"), false},
		{apierrors.NewAlreadyExists(gr, "p"), false},
		{apierrors.NewBadRequest("container main is waiting"), false},
		{fmt.Errorf("logs: %w", context.DeadlineExceeded), false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestParseMemcg checks how agent-oom finds a process's memory cgroup in
// /proc/PID/cgroup: cgroup v1 (the local cluster's hosts, where the
// unified line is empty), hybrid, and v2 only.
func TestParseMemcg(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     memcg
		wantErr  bool
	}{
		{name: "v1", in: "9:name=systemd:/\n4:memory:/k8s.io/abc\n1:cpu:/\n0::/\n", want: memcg{dir: "/sys/fs/cgroup/memory/k8s.io/abc"}},
		{name: "v1 joint controllers", in: "5:memory,hugetlb:/k8s.io/abc\n", want: memcg{dir: "/sys/fs/cgroup/memory/k8s.io/abc"}},
		{name: "v2", in: "0::/kubepods/pod1/abc\n", want: memcg{dir: "/sys/fs/cgroup/kubepods/pod1/abc", v2: true}},
		{name: "none", in: "3:cpu:/\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMemcg([]byte(tc.in), "/sys/fs/cgroup")
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestNodeNumber(t *testing.T) {
	for _, tc := range []struct {
		name string
		want int
	}{{"layercache-node1", 1}, {"layercache-node12", 12}, {"layercache-node0", 0}, {"kind-worker", 0}, {"layercache-node", 0}} {
		got, err := nodeNumber(tc.name)
		if got != tc.want || (err == nil) != (tc.want > 0) {
			t.Errorf("nodeNumber(%q) = %d, %v; want %d", tc.name, got, err, tc.want)
		}
	}
}

func TestReportName(t *testing.T) {
	for fault, want := range map[string]string{faultNone: "report", "": "report", faultAgentKill: "report-agent-kill", faultAgentOOM: "report-agent-oom", faultNodeRestart: "report-node-restart", faultNodeReboot: "report-node-reboot", faultAPIServer: "report-apiserver", faultRegistry: "report-registry"} {
		if got := reportName(fault); got != want {
			t.Errorf("reportName(%q) = %q, want %q", fault, got, want)
		}
	}
}

// TestDescribeLostFile checks that a lost file names the outage its pod
// was seen ending in: a kill's, or a gap between agent processes.
func TestDescribeLostFile(t *testing.T) {
	at := time.Date(2026, 11, 26, 14, 0, 0, 0, time.UTC)
	fault := &faultRun{Kind: faultAgentKill, Events: []faultEvent{{At: at, Back: 10 * time.Second}}}
	procs := []procSample{
		{PID: 1, LastSeen: at.Add(-time.Second / 2)},
		{PID: 2, FirstSeen: at.Add(10 * time.Second), LastSeen: at.Add(time.Minute)},
		{PID: 3, FirstSeen: at.Add(2 * time.Minute)},
	}
	l := &load{byName: map[string]*build{}}
	for _, tc := range []struct {
		seen time.Duration
		want []string
	}{
		{-5 * time.Second, nil},
		{3 * time.Second, []string{"during agent killed 14:00:00.0–14:00:10.0", "during agent pid 1 gone, pid 2 not yet"}},
		{11 * time.Second, []string{"during agent killed"}},
		{90 * time.Second, []string{"during agent pid 2 gone, pid 3 not yet 14:01:00.0–14:02:00.0"}},
	} {
		b := &build{Name: "b-0001", Volume: "csi", EndReason: "Discarded", Ended: at.Add(tc.seen - time.Second), SeenEnd: at.Add(tc.seen)}
		l.byName[b.Name] = b
		got := l.describeFile("c0/b-0001", awayWindows(fault, procs))
		if tc.want == nil && strings.Contains(got, "during") {
			t.Errorf("seen at %s: %q names an outage", tc.seen, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("seen at %s: %q lacks %q", tc.seen, got, w)
			}
		}
	}
}

// TestStandbyOf checks the manager-leader fault's copy of the manager's
// Deployment: its own selector, its ports moved, one replica.
func TestStandbyOf(t *testing.T) {
	labels := map[string]string{"app.kubernetes.io/name": "layercache", "app.kubernetes.io/component": "manager"}
	orig := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: managerDeployment, Namespace: "layercache-system"}}
	orig.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	orig.Spec.Template.Labels = labels
	orig.Spec.Template.Spec.Containers = []corev1.Container{{
		Name:  "manager",
		Args:  []string{"manager", "--metrics-bind-address=:8082", "--health-probe-bind-address=127.0.0.1:8083", "--leader-elect=true"},
		Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8082}, {Name: "health", ContainerPort: 8083}},
	}}
	d, err := standbyOf(orig)
	if err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if want := []string{"manager", "--metrics-bind-address=:18082", "--health-probe-bind-address=127.0.0.1:18083", "--leader-elect=true"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	if c.Ports[0].ContainerPort != 18082 || c.Ports[1].ContainerPort != 18083 {
		t.Errorf("ports %+v", c.Ports)
	}
	if d.Name != standbyDeployment || *d.Spec.Replicas != 1 || d.Spec.Selector.MatchLabels[standbyLabel] != "true" || d.Spec.Template.Labels[standbyLabel] != "true" {
		t.Errorf("standby %s: replicas %d, selector %v, pod labels %v", d.Name, *d.Spec.Replicas, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	if _, ok := orig.Spec.Selector.MatchLabels[standbyLabel]; ok || orig.Spec.Template.Spec.Containers[0].Args[1] != "--metrics-bind-address=:8082" {
		t.Error("standbyOf changed the original")
	}
	orig.Spec.Template.Spec.Containers[0].Args = []string{"manager"}
	if _, err := standbyOf(orig); err == nil {
		t.Error("no error for a manager without port flags")
	}
}

// TestStranded checks which pods the node-reboot fault reaps as stranded
// by the old kubelet; it needs no cluster.
func TestStranded(t *testing.T) {
	back := time.Date(2026, 11, 29, 10, 29, 0, 0, time.UTC)
	pod := func(phase corev1.PodPhase, scheduled time.Time, states ...corev1.ContainerState) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(scheduled)},
		}}}
		for _, s := range states {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{State: s})
		}
		return p
	}
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"scheduled between the fault's start and the kill (29 Nov)", pod(corev1.PodPending, back.Add(-10*time.Second), waiting), true},
		{"scheduled long before the reboot", pod(corev1.PodPending, back.Add(-time.Minute), waiting), true},
		{"scheduled by the new kubelet's time", pod(corev1.PodPending, back.Add(time.Second), waiting), false},
		{"one container running", pod(corev1.PodPending, back.Add(-time.Minute), waiting, running), false},
		{"no container status yet", pod(corev1.PodPending, back.Add(-time.Minute)), false},
		{"running", pod(corev1.PodRunning, back.Add(-time.Minute), running), false},
	} {
		if got := stranded(tc.pod, back); got != tc.want {
			t.Errorf("%s: stranded = %v, want %v", tc.name, got, tc.want)
		}
	}
}
