// Package kind is the e2e harness's kind backend (`make up CLUSTER=kind`),
// for machines with a Docker engine: it creates a kind cluster with the same
// shape as the local backend (NODES schedulable nodes), loads the image
// archives that hack/imagebuild writes with kind's `load image-archive`
// path, and writes the kubeconfig and cluster.json where the e2e framework
// looks for them.
//
// CI runs the local backend (e2e/cluster/up.sh); kind needs Docker, which
// CI machines do not have.
package kind

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/kind/pkg/cluster"
	"sigs.k8s.io/kind/pkg/cluster/nodes"
	"sigs.k8s.io/kind/pkg/cluster/nodeutils"
	"sigs.k8s.io/kind/pkg/log"
	"sigs.k8s.io/yaml"
)

// DefaultName is the kind cluster's name unless Options.Name says otherwise.
const DefaultName = "layercache-e2e"

// untaintControlPlane lets pods run on the control-plane node even when the
// cluster has workers, so that every node is a layercache node as on the
// local backend.
const untaintControlPlane = `kind: InitConfiguration
nodeRegistration:
  taints: []
`

// Options describe the cluster to create.
type Options struct {
	// Name of the kind cluster.
	Name string
	// Nodes is the number of schedulable nodes; the first one is the control
	// plane.
	Nodes int
	// NodeImage is the kindest/node image; empty means kind's default.
	NodeImage string
	// Kubeconfig is the file to write the cluster's kubeconfig to.
	Kubeconfig string
	// ImageArchives are `docker save` tarballs to load into every node.
	ImageArchives []string
}

// Validate reports the first unusable option.
func (o Options) Validate() error {
	if errs := validation.IsDNS1123Label(o.Name); len(errs) > 0 {
		return fmt.Errorf("cluster name %q: %v", o.Name, errs)
	}
	if o.Nodes < 1 || o.Nodes > 10 {
		return fmt.Errorf("nodes %d: want 1 to 10", o.Nodes)
	}
	if o.Kubeconfig == "" || !filepath.IsAbs(o.Kubeconfig) {
		return fmt.Errorf("kubeconfig %q: want an absolute path, e.g. $PWD/_output/cluster/kubeconfig", o.Kubeconfig)
	}
	for _, a := range o.ImageArchives {
		if _, err := os.Stat(a); err != nil {
			return fmt.Errorf("image archive: %w (build it with hack/imagebuild/cmd/buildimage)", err)
		}
	}
	return nil
}

// Config returns the kind cluster configuration for o.
func Config(o Options) *v1alpha4.Cluster {
	c := &v1alpha4.Cluster{
		TypeMeta: v1alpha4.TypeMeta{Kind: "Cluster", APIVersion: "kind.x-k8s.io/v1alpha4"},
		Name:     o.Name,
	}
	controlPlane := v1alpha4.Node{Role: v1alpha4.ControlPlaneRole}
	if o.Nodes > 1 {
		// kind untaints a lone control plane itself.
		controlPlane.KubeadmConfigPatches = []string{untaintControlPlane}
	}
	c.Nodes = append(c.Nodes, controlPlane)
	for range o.Nodes - 1 {
		c.Nodes = append(c.Nodes, v1alpha4.Node{Role: v1alpha4.WorkerRole})
	}
	for i := range c.Nodes {
		c.Nodes[i].Image = o.NodeImage
	}
	return c
}

// ConfigYAML is Config as kind's YAML, e.g. for `kind create cluster --config`.
func ConfigYAML(o Options) ([]byte, error) {
	b, err := yaml.Marshal(Config(o))
	if err != nil {
		return nil, fmt.Errorf("kind config: %w", err)
	}
	return b, nil
}

// ClusterInfo is the cluster.json the e2e framework reads
// (framework.Cluster).
type ClusterInfo struct {
	Backend    string     `json:"backend"`
	Kubeconfig string     `json:"kubeconfig"`
	Nodes      []NodeInfo `json:"nodes"`
}

// NodeInfo is one node in ClusterInfo.
type NodeInfo struct {
	Name      string `json:"name"`
	Container string `json:"container"`
}

// Up creates the cluster if it does not exist, loads the image archives
// into every node and writes the kubeconfig and, next to it, cluster.json.
func Up(ctx context.Context, logger log.Logger, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	provider := cluster.NewProvider(cluster.ProviderWithLogger(logger))
	existing, err := provider.List()
	if err != nil {
		return fmt.Errorf("listing kind clusters (is a Docker engine running?): %w", err)
	}
	if slices.Contains(existing, o.Name) {
		logger.V(0).Infof("kind cluster %s exists; reloading images", o.Name)
	} else {
		err := provider.Create(o.Name,
			cluster.CreateWithV1Alpha4Config(Config(o)),
			cluster.CreateWithKubeconfigPath(o.Kubeconfig),
			cluster.CreateWithWaitForReady(0),
			cluster.CreateWithDisplayUsage(false),
			cluster.CreateWithDisplaySalutation(false))
		if err != nil {
			return fmt.Errorf("creating kind cluster %s: %w", o.Name, err)
		}
	}
	if err := provider.ExportKubeConfig(o.Name, o.Kubeconfig, false); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", o.Kubeconfig, err)
	}

	kindNodes, err := provider.ListInternalNodes(o.Name)
	if err != nil {
		return fmt.Errorf("listing nodes of kind cluster %s: %w", o.Name, err)
	}
	// "<name>-control-plane" sorts before "<name>-worker*": the first node
	// is the control plane, as in Config.
	slices.SortFunc(kindNodes, func(a, b nodes.Node) int { return strings.Compare(a.String(), b.String()) })
	info := ClusterInfo{Backend: "kind", Kubeconfig: o.Kubeconfig}
	for _, n := range kindNodes {
		for _, archive := range o.ImageArchives {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := loadArchive(n, archive); err != nil {
				return fmt.Errorf("loading %s into node %s: %w", archive, n.String(), err)
			}
		}
		// kind names each node's container after the node.
		info.Nodes = append(info.Nodes, NodeInfo{Name: n.String(), Container: n.String()})
	}
	return writeClusterInfo(filepath.Join(filepath.Dir(o.Kubeconfig), "cluster.json"), info)
}

// loadArchive is what `kind load image-archive` does for one node.
func loadArchive(n nodes.Node, archive string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	return nodeutils.LoadImageArchive(n, f)
}

func writeClusterInfo(file string, info ClusterInfo) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}

// Down deletes the kind cluster and its kubeconfig entry.
func Down(logger log.Logger, name, kubeconfig string) error {
	provider := cluster.NewProvider(cluster.ProviderWithLogger(logger))
	if err := provider.Delete(name, kubeconfig); err != nil {
		return fmt.Errorf("deleting kind cluster %s: %w", name, err)
	}
	return nil
}
