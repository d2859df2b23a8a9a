package envtestassets

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDir(t *testing.T) {
	complete, partial := t.TempDir(), t.TempDir()
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if err := os.WriteFile(filepath.Join(complete, bin), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(partial, "etcd"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, env, wantErr string
	}{
		{name: "unset", env: "", wantErr: "KUBEBUILDER_ASSETS is not set"},
		{name: "a binary missing, one not executable", env: partial, wantErr: "kube-apiserver: stat"},
		{name: "both there", env: complete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBEBUILDER_ASSETS", tt.env)
			dir, err := Dir("test-envtest")
			switch {
			case tt.wantErr == "" && (err != nil || dir != tt.env):
				t.Errorf("Dir() = %q, %v; want %q", dir, err, tt.env)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "make test-envtest")):
				t.Errorf("Dir() error = %v; want one with %q that names make test-envtest", err, tt.wantErr)
			}
		})
	}
}
