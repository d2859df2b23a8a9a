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
