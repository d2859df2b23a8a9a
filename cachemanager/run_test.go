package cachemanager

import (
	"strings"
	"testing"
)

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		modify  func(*Options)
		wantErr string // substring; "" for valid
	}{
		{name: "defaults", modify: func(*Options) {}},
		{name: "metrics off", modify: func(o *Options) { o.MetricsBindAddress = "0" }},
		{name: "host and port", modify: func(o *Options) { o.HealthProbeBindAddress = "127.0.0.1:9443" }},
		{name: "no leader election needs no id", modify: func(o *Options) { o.LeaderElect = false; o.LeaderElectionID = "" }},
		{name: "port missing", modify: func(o *Options) { o.MetricsBindAddress = "8082" }, wantErr: `--metrics-bind-address "8082"`},
		{name: "port out of range", modify: func(o *Options) { o.HealthProbeBindAddress = ":70000" }, wantErr: "not a number from 1 to 65535"},
		{name: "bad lease name", modify: func(o *Options) { o.LeaderElectionID = "Layer_Cache" }, wantErr: `--leader-election-id "Layer_Cache"`},
		{name: "bad namespace", modify: func(o *Options) { o.LeaderElectionNamespace = "a/b" }, wantErr: `--leader-election-namespace "a/b"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tc.modify(&o)
			err := o.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
