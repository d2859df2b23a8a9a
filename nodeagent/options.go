package nodeagent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/remote"
)

// Environment variables that set flag defaults; a DaemonSet sets NODE_NAME
// from the pod's spec.nodeName.
const (
	EnvRoot     = "LAYERCACHE_ROOT"
	EnvNodeName = "NODE_NAME"
	// EnvNamespace is the agent's own namespace, where the registry
	// Secrets of StorageClasses live; a DaemonSet sets it from
	// metadata.namespace.
	EnvNamespace = "POD_NAMESPACE"
)

// Options configure the node agent.
type Options struct {
	// Root is the layerfs store's directory on the node. The agent's
	// container must see it at the same path as the host, because PVs
	// carry host paths into it.
	Root string
	// NodeName is the node the agent serves; it provisions only claims
	// placed on it and deletes only PVs stamped with it.
	NodeName string
	// Kubeconfig is a kubeconfig file; empty means in-cluster config (or
	// $KUBECONFIG and ~/.kube/config outside a cluster).
	Kubeconfig string
	// MetricsBindAddress serves /metrics; "0" disables it.
	MetricsBindAddress string
	// HealthProbeBindAddress serves /healthz and /readyz; "0" disables it.
	HealthProbeBindAddress string
	// MaxLayers is the head depth above which a cache is squashed after a
	// commit.
	MaxLayers int
	// GCMaxAge and GCMaxBytes bound the node's store; 0 disables a bound.
	GCMaxAge   time.Duration
	GCMaxBytes int64
	// GCMinFreeBytes and GCMinFreePercent evict least recently used caches
	// while the store's filesystem has less free space; 0 disables each.
	GCMinFreeBytes   int64
	GCMinFreePercent float64
	// ResyncInterval is how often the agent reports cache status, applies
	// retention and runs GC.
	ResyncInterval time.Duration
	// Namespace is the agent's own namespace: registry Secrets are read
	// there only.
	Namespace string
	// RegistryCompression compresses the layers the agent pushes: zstd or
	// gzip.
	RegistryCompression string
	// SnapshotImageBytes sizes the btrfs image file that holds the
	// snapshot layout's volumes when the root is not on btrfs (sparse:
	// it takes disk only as volumes fill it).
	SnapshotImageBytes int64
	// MkfsBtrfs formats that image; the agent's image carries it.
	MkfsBtrfs string
	// KubeletDir is the kubelet's root directory (its --root-dir). Set,
	// the agent serves CSI inline volumes there and registers the driver
	// with the kubelet; empty, it serves claims only.
	KubeletDir string
	// CSIDefaultBytes bounds what a CSI inline volume without a size
	// attribute may add to its cache; CSIMaxBytes bounds the size
	// attribute. A CSI volume is always limited: it passes no
	// ResourceQuota.
	CSIDefaultBytes, CSIMaxBytes int64
	// LazyfsSidecar: the layers mounted before their bytes are here are
	// served by the pod's lazyfs container (`layercache lazyfs`), so that
	// their builds' reads wait for a restarted agent instead of failing.
	LazyfsSidecar bool
}

// DefaultOptions returns the defaults, taking root and node name from the
// environment when set.
func DefaultOptions() Options {
	root := layerfs.DefaultRoot
	if v := os.Getenv(EnvRoot); v != "" {
		root = v
	}
	namespace := "layercache-system"
	if v := os.Getenv(EnvNamespace); v != "" {
		namespace = v
	}
	return Options{
		Namespace:              namespace,
		RegistryCompression:    string(remote.DefaultCompression),
		Root:                   root,
		NodeName:               os.Getenv(EnvNodeName),
		MetricsBindAddress:     ":8080",
		HealthProbeBindAddress: ":8081",
		MaxLayers:              layerfs.DefaultMaxLayers,
		ResyncInterval:         time.Minute,
		// The kubelet evicts pods when the node's filesystem has less than
		// 10% free (its default); caches go first, before builds do.
		GCMinFreePercent:   15,
		SnapshotImageBytes: layerfs.DefaultSnapshotImageBytes,
		MkfsBtrfs:          "mkfs.btrfs",
		CSIDefaultBytes:    10 << 30,
		CSIMaxBytes:        100 << 30,
	}
}

// AddFlags binds the options to flags; the current values are the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Root, "root", o.Root, "layer store directory on the node; must be mounted at the same path as on the host (env "+EnvRoot+")")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "name of the node this agent serves (env "+EnvNodeName+")")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file; empty uses the in-cluster config")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "address that serves Prometheus /metrics; 0 disables")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "address that serves /healthz and /readyz; 0 disables")
	fs.IntVar(&o.MaxLayers, "max-layers", o.MaxLayers, "squash a cache in the background once it has more layers than this")
	fs.DurationVar(&o.GCMaxAge, "gc-max-age", o.GCMaxAge, "remove caches unused for longer than this from the node; 0 keeps them")
	fs.Var(&bytesFlag{&o.GCMaxBytes}, "gc-max-size", "remove least recently used caches while the node's store is larger than this (e.g. 100Gi); 0 disables")
	fs.Var(&bytesFlag{&o.GCMinFreeBytes}, "gc-min-free", "evict least recently used caches while the store's filesystem has less free space than this (e.g. 20Gi); 0 disables")
	fs.Float64Var(&o.GCMinFreePercent, "gc-min-free-percent", o.GCMinFreePercent, "evict least recently used caches while the store's filesystem has less than this percentage free; keep it above the kubelet's eviction threshold (10% by default); 0 disables")
	fs.DurationVar(&o.ResyncInterval, "resync-interval", o.ResyncInterval, "how often to report cache status, apply retention and run GC")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "the agent's own namespace, where StorageClasses' registry Secrets are read (env "+EnvNamespace+")")
	fs.Var(&bytesFlag{&o.SnapshotImageBytes}, "snapshot-image-size", "size of the sparse btrfs image that holds layout: snapshot volumes when --root is not on btrfs (e.g. 100Gi); it takes disk only as it fills")
	fs.StringVar(&o.MkfsBtrfs, "mkfs-btrfs", o.MkfsBtrfs, "mkfs.btrfs program that formats that image (a name on PATH or a path)")
	fs.StringVar(&o.KubeletDir, "kubelet-dir", o.KubeletDir, "the kubelet's root directory (its --root-dir, usually /var/lib/kubelet): serve CSI inline volumes of driver "+v1alpha1.CSIDriverName+" there; empty serves claims only")
	fs.Var(&bytesFlag{&o.CSIDefaultBytes}, "csi-default-size", "the most a CSI inline volume without a size attribute may add to its cache (e.g. 10Gi)")
	fs.Var(&bytesFlag{&o.CSIMaxBytes}, "csi-max-size", "the largest size attribute a CSI inline volume may ask for (e.g. 100Gi)")
	fs.BoolVar(&o.LazyfsSidecar, "lazyfs-sidecar", o.LazyfsSidecar, "a container of the agent's pod runs `layercache lazyfs --root` (same root): it serves the layers mounted before their bytes are here, so that builds reading them outlive an agent restart; false serves them from this process")
	fs.StringVar(&o.RegistryCompression, "registry-compression", o.RegistryCompression, "compression of the layers pushed to registries: zstd or gzip (for registries that refuse zstd blobs)")
}

// Validate checks every option and reports all problems at once.
func (o *Options) Validate() error {
	var errs []error
	switch {
	case o.Root == "":
		errs = append(errs, fmt.Errorf("--root is empty: pass the store directory, for example --root %s", layerfs.DefaultRoot))
	case !filepath.IsAbs(o.Root):
		errs = append(errs, fmt.Errorf("--root %q is not an absolute path: PVs carry it as a host path, so pass an absolute directory such as %s", o.Root, layerfs.DefaultRoot))
	}
	if o.NodeName == "" {
		errs = append(errs, fmt.Errorf("node name is empty: pass --node-name or set %s (in a DaemonSet, from the field spec.nodeName)", EnvNodeName))
	} else if msgs := validation.IsDNS1123Subdomain(o.NodeName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("node name %q is not a valid node name: %s", o.NodeName, msgs[0]))
	}
	if err := bootstrap.ValidateBindAddress("--metrics-bind-address", o.MetricsBindAddress); err != nil {
		errs = append(errs, err)
	}
	if err := bootstrap.ValidateBindAddress("--health-probe-bind-address", o.HealthProbeBindAddress); err != nil {
		errs = append(errs, err)
	}
	if o.MaxLayers < 1 {
		errs = append(errs, fmt.Errorf("--max-layers %d is too small: use at least 1 (default %d)", o.MaxLayers, layerfs.DefaultMaxLayers))
	}
	if o.GCMaxAge < 0 {
		errs = append(errs, fmt.Errorf("--gc-max-age %s is negative: use a duration such as 168h, or 0 to keep caches regardless of age", o.GCMaxAge))
	}
	if o.SnapshotImageBytes < 1<<30 {
		errs = append(errs, fmt.Errorf("--snapshot-image-size %d is too small: use at least 1Gi (default %d)", o.SnapshotImageBytes, layerfs.DefaultSnapshotImageBytes))
	}
	if o.GCMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("--gc-max-size %d is negative: use a size such as 100Gi, or 0 for no bound", o.GCMaxBytes))
	}
	if o.GCMinFreeBytes < 0 {
		errs = append(errs, fmt.Errorf("--gc-min-free %d is negative: use a size such as 20Gi, or 0 to disable", o.GCMinFreeBytes))
	}
	if o.GCMinFreePercent < 0 || o.GCMinFreePercent >= 100 {
		errs = append(errs, fmt.Errorf("--gc-min-free-percent %g is out of range: use a percentage from 0 (disabled) to below 100, for example 15", o.GCMinFreePercent))
	}
	if msgs := validation.IsDNS1123Label(o.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--namespace %q is not a namespace name: %s; pass the agent's own namespace (env %s, from metadata.namespace)", o.Namespace, msgs[0], EnvNamespace))
	}
	if c := remote.Compression(o.RegistryCompression); c != remote.Zstd && c != remote.Gzip {
		errs = append(errs, fmt.Errorf("--registry-compression %q is not known: use zstd (default) or gzip", o.RegistryCompression))
	}
	if o.KubeletDir != "" && (!filepath.IsAbs(o.KubeletDir) || filepath.Clean(o.KubeletDir) != o.KubeletDir) {
		errs = append(errs, fmt.Errorf("--kubelet-dir %q is not a clean absolute path: pass the kubelet's --root-dir, for example /var/lib/kubelet, or leave it empty to serve no CSI volumes", o.KubeletDir))
	}
	if o.CSIDefaultBytes <= 0 || o.CSIMaxBytes < o.CSIDefaultBytes {
		errs = append(errs, fmt.Errorf("--csi-default-size %d and --csi-max-size %d: both must be positive, the default at most the maximum (defaults 10Gi and 100Gi)", o.CSIDefaultBytes, o.CSIMaxBytes))
	}
	if o.ResyncInterval < time.Second {
		errs = append(errs, fmt.Errorf("--resync-interval %s is too short: use at least 1s, for example 1m", o.ResyncInterval))
	}
	return errors.Join(errs...)
}

// bytesFlag is a size flag that takes Kubernetes quantities (100Gi, 5G).
type bytesFlag struct{ p *int64 }

func (b *bytesFlag) String() string {
	if b.p == nil {
		return "0"
	}
	return resource.NewQuantity(*b.p, resource.BinarySI).String()
}

func (b *bytesFlag) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q is not a size: use a quantity such as 100Gi or 500M", s)
	}
	*b.p = q.Value()
	return nil
}

func (b *bytesFlag) Type() string { return "quantity" }
