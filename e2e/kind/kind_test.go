package kind

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/yaml"
)

func TestConfig(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		wantRoles []v1alpha4.NodeRole
		untaint   bool
	}{
		{
			name:      "one node is the control plane",
			opts:      Options{Name: "c", Nodes: 1},
			wantRoles: []v1alpha4.NodeRole{v1alpha4.ControlPlaneRole},
		},
		{
			name:      "two nodes: control plane untainted plus a worker",
			opts:      Options{Name: "c", Nodes: 2},
			wantRoles: []v1alpha4.NodeRole{v1alpha4.ControlPlaneRole, v1alpha4.WorkerRole},
			untaint:   true,
		},
		{
			name:      "node image on every node",
			opts:      Options{Name: "c", Nodes: 3, NodeImage: "kindest/node:v1.35.0"},
			wantRoles: []v1alpha4.NodeRole{v1alpha4.ControlPlaneRole, v1alpha4.WorkerRole, v1alpha4.WorkerRole},
			untaint:   true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config(tt.opts)
			if c.Name != tt.opts.Name || c.Kind != "Cluster" || c.APIVersion != "kind.x-k8s.io/v1alpha4" {
				t.Errorf("header = %q %s %s", c.Name, c.Kind, c.APIVersion)
			}
			if len(c.Nodes) != len(tt.wantRoles) {
				t.Fatalf("%d nodes, want %d", len(c.Nodes), len(tt.wantRoles))
			}
			for i, n := range c.Nodes {
				if n.Role != tt.wantRoles[i] {
					t.Errorf("node %d role %s, want %s", i, n.Role, tt.wantRoles[i])
				}
				if n.Image != tt.opts.NodeImage {
					t.Errorf("node %d image %q, want %q", i, n.Image, tt.opts.NodeImage)
				}
			}
			patched := len(c.Nodes[0].KubeadmConfigPatches) == 1 && c.Nodes[0].KubeadmConfigPatches[0] == untaintControlPlane
			if patched != tt.untaint {
				t.Errorf("control plane patches = %q, want untaint %v", c.Nodes[0].KubeadmConfigPatches, tt.untaint)
			}
		})
	}
}

func TestConfigYAMLRoundTrips(t *testing.T) {
	opts := Options{Name: "layercache-e2e", Nodes: 2}
	b, err := ConfigYAML(opts)
	if err != nil {
		t.Fatal(err)
	}
	var back v1alpha4.Cluster
	if err := yaml.UnmarshalStrict(b, &back); err != nil {
		t.Fatalf("kind config does not parse back strictly: %v\n%s", err, b)
	}
	for _, want := range []string{"apiVersion: kind.x-k8s.io/v1alpha4", "kind: Cluster", "role: control-plane", "role: worker", "taints: []"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("config lacks %q:\n%s", want, b)
		}
	}
	if len(back.Nodes) != 2 {
		t.Errorf("parsed %d nodes, want 2", len(back.Nodes))
	}
}

func TestOptionsValidate(t *testing.T) {
	archive := filepath.Join(t.TempDir(), "img.tar")
	if err := os.WriteFile(archive, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ok := Options{Name: DefaultName, Nodes: 1, Kubeconfig: "/tmp/kubeconfig", ImageArchives: []string{archive}}
	tests := []struct {
		name    string
		mutate  func(*Options)
		wantErr string
	}{
		{name: "ok", mutate: func(*Options) {}},
		{name: "bad name", mutate: func(o *Options) { o.Name = "Bad_Name" }, wantErr: "cluster name"},
		{name: "no nodes", mutate: func(o *Options) { o.Nodes = 0 }, wantErr: "want 1 to 10"},
		{name: "relative kubeconfig", mutate: func(o *Options) { o.Kubeconfig = "kubeconfig" }, wantErr: "absolute path"},
		{name: "missing archive", mutate: func(o *Options) { o.ImageArchives = []string{archive + ".missing"} }, wantErr: "buildimage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.mutate(&o)
			err := o.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}
