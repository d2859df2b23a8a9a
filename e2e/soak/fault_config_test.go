//go:build e2e

package soak

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestFaultConfig checks the SOAK_FAULT* variables; it needs no cluster.
func TestFaultConfig(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		want    config
		wantErr string
	}{
		{env: nil, want: config{Fault: faultNone, FaultKills: 3, FaultEvery: 20 * time.Second, FaultDown: 30 * time.Second}},
		{env: map[string]string{"SOAK_FAULT": "agent-kill", "SOAK_FAULT_KILLS": "5", "SOAK_FAULT_EVERY": "7s"},
			want: config{Fault: faultAgentKill, FaultKills: 5, FaultEvery: 7 * time.Second, FaultDown: 30 * time.Second}},
		{env: map[string]string{"SOAK_FAULT": "apiserver", "SOAK_FAULT_DOWN": "1m"},
			want: config{Fault: faultAPIServer, FaultKills: 3, FaultEvery: 20 * time.Second, FaultDown: time.Minute}},
		{env: map[string]string{"SOAK_FAULT": "reboot"}, wantErr: "SOAK_FAULT"},
		{env: map[string]string{"SOAK_FAULT_KILLS": "0"}, wantErr: "SOAK_FAULT_KILLS"},
		{env: map[string]string{"SOAK_FAULT_DOWN": "-3s"}, wantErr: "SOAK_FAULT_DOWN"},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			for _, k := range []string{"SOAK_FAULT", "SOAK_FAULT_KILLS", "SOAK_FAULT_EVERY", "SOAK_FAULT_DOWN"} {
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
			got := config{Fault: c.Fault, FaultKills: c.FaultKills, FaultEvery: c.FaultEvery, FaultDown: c.FaultDown}
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

func TestReportName(t *testing.T) {
	for fault, want := range map[string]string{faultNone: "report", "": "report", faultAgentKill: "report-agent-kill", faultAPIServer: "report-apiserver"} {
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
