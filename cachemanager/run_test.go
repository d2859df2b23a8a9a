package cachemanager

import (
	"strings"
	"testing"
	"time"
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
		{name: "caches kept forever", modify: func(o *Options) { o.CacheMaxAge = 0 }},
		{name: "negative max age", modify: func(o *Options) { o.CacheMaxAge = -time.Hour }, wantErr: "--cache-max-age -1h0m0s is negative"},
		{name: "namespace bound", modify: func(o *Options) { o.NamespaceMaxCacheSize = "50Gi" }},
		{name: "namespace bound not a quantity", modify: func(o *Options) { o.NamespaceMaxCacheSize = "50GB" }, wantErr: `--namespace-max-cache-size "50GB": use a quantity above 0`},
		{name: "namespace bound zero", modify: func(o *Options) { o.NamespaceMaxCacheSize = "0" }, wantErr: `--namespace-max-cache-size "0"`},
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
