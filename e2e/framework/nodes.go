package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
)

// Cluster describes the cluster the harness started, from the cluster.json
// it writes next to the kubeconfig.
type Cluster struct {
	// Backend is "local" (this machine) or "kind".
	Backend string `json:"backend"`
	Nodes   []Node `json:"nodes"`
	// Registry is the cluster's OCI registry; nil unless the harness
	// started one (`make up NODES=2`, or up.sh --with registry).
	Registry *Registry `json:"registry,omitempty"`
}

// Node is one node of the cluster.
type Node struct {
	Name string `json:"name"`
	// HostRoot is where the host (where the test runs) sees the node's
	// /var/lib/layercache; local backend only.
	HostRoot string `json:"hostRoot,omitempty"`
	// PID is a process in the node's mount namespace; local backend only.
	PID int `json:"pid,omitempty"`
	// Container is the node's Docker container; kind backend only.
	Container string `json:"container,omitempty"`
}

// LoadCluster reads cluster.json from the directory of KUBECONFIG.
func LoadCluster() (*Cluster, error) {
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		return nil, fmt.Errorf("KUBECONFIG is not set: start a cluster with `make up`")
	}
	file := filepath.Join(filepath.Dir(kubeconfig), "cluster.json")
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the harness's cluster description (KUBECONFIG must be the one `make up` printed): %w", err)
	}
	var c Cluster
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", file, err)
	}
	if len(c.Nodes) == 0 {
		return nil, fmt.Errorf("%s lists no nodes", file)
	}
	return &c, nil
}

// Node returns the node called name.
func (c *Cluster) Node(name string) (Node, error) {
	i := slices.IndexFunc(c.Nodes, func(n Node) bool { return n.Name == name })
	if i < 0 {
		return Node{}, fmt.Errorf("no node %q in the cluster (nodes: %v)", name, c.NodeNames())
	}
	return c.Nodes[i], nil
}

// NodeNames lists the nodes' names.
func (c *Cluster) NodeNames() []string {
	names := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		names[i] = n.Name
	}
	return names
}

// NodeCommand returns a command that runs argv on node n, seeing the node's
// own mounts: nsenter into the node's mount namespace (local), or docker
// exec (kind).
func (c *Cluster) NodeCommand(ctx context.Context, n Node, argv ...string) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("no command to run on node %s", n.Name)
	}
	switch c.Backend {
	case "local":
		if n.PID <= 0 {
			return nil, fmt.Errorf("node %s has no process id in cluster.json; restart the cluster with `make up`", n.Name)
		}
		args := append([]string{"--target", strconv.Itoa(n.PID), "--mount", "--"}, argv...)
		return exec.CommandContext(ctx, "nsenter", args...), nil
	case "kind":
		return exec.CommandContext(ctx, "docker", append([]string{"exec", n.Container}, argv...)...), nil
	}
	return nil, fmt.Errorf("unknown backend %q in cluster.json (want local or kind)", c.Backend)
}

// NodeExec runs argv on node n and returns its standard output.
func (c *Cluster) NodeExec(ctx context.Context, n Node, argv ...string) (string, error) {
	cmd, err := c.NodeCommand(ctx, n, argv...)
	if err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("on node %s: %q: %w: %s", n.Name, argv, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}

// ReadNodeFile reads file (an absolute path as the node sees it) from
// node n's filesystem.
func (c *Cluster) ReadNodeFile(ctx context.Context, n Node, file string) ([]byte, error) {
	if !path.IsAbs(file) {
		return nil, fmt.Errorf("node path %q must be absolute", file)
	}
	if c.Backend == "local" && n.PID > 0 {
		// The node's mount namespace, through its process's root.
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(n.PID), "root", file))
		if err != nil {
			return nil, fmt.Errorf("on node %s: %w", n.Name, err)
		}
		return b, nil
	}
	out, err := c.NodeExec(ctx, n, "cat", file)
	return []byte(out), err
}
