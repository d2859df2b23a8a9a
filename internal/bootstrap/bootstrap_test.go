package bootstrap

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/layercache/layercache/api/v1alpha1"
)

func TestValidateBindAddress(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"0", true}, {":8080", true}, {"127.0.0.1:8080", true}, {"[::1]:9090", true},
		{":0", false}, {"8080", false}, {":http", false}, {":70000", false}, {"", false},
	} {
		err := ValidateBindAddress("--metrics-bind-address", tc.addr)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateBindAddress(%q) = %v, want ok=%v", tc.addr, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--metrics-bind-address") {
			t.Errorf("error %q does not name the flag", err)
		}
	}
}

func TestRESTConfig(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, flag, env string }{
		{"flag", kubeconfig, ""},
		{"KUBECONFIG", "", kubeconfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.env)
			cfg, err := RESTConfig(tc.flag, "layercache-test")
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != "https://127.0.0.1:6443" || cfg.UserAgent != "layercache-test" {
				t.Errorf("config host %q agent %q", cfg.Host, cfg.UserAgent)
			}
		})
	}
	if _, err := RESTConfig(filepath.Join(t.TempDir(), "missing"), "x"); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("a missing --kubeconfig: %v, want an error naming the flag", err)
	}
}

func TestSchemeKnowsCaches(t *testing.T) {
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ObjectKinds(&v1alpha1.Cache{}); err != nil {
		t.Errorf("scheme: %v", err)
	}
}
