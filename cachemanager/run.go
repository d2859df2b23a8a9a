package cachemanager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/layercache/layercache/internal/bootstrap"
)

// Component names the manager in Events and in the API server's logs.
const Component = "layercache-manager"

// Options configure `layercache manager`.
type Options struct {
	// Kubeconfig is the kubeconfig file to use; empty means in-cluster
	// config, then $KUBECONFIG, then ~/.kube/config.
	Kubeconfig string
	// MetricsBindAddress serves Prometheus metrics; "0" turns them off.
	MetricsBindAddress string
	// HealthProbeBindAddress serves /healthz and /readyz; "0" turns them off.
	HealthProbeBindAddress string
	// LeaderElect makes replicas elect one active manager.
	LeaderElect bool
	// LeaderElectionNamespace holds the leader Lease; empty means the
	// namespace the manager's pod runs in.
	LeaderElectionNamespace string
	// LeaderElectionID names the leader Lease.
	LeaderElectionID string
	// CacheMaxAge deletes a Cache that no node has used for this long,
	// unless its spec or its StorageClass sets its own; 0 keeps Caches.
	CacheMaxAge time.Duration
	// NamespaceMaxCacheSize bounds the total size of the caches of a
	// namespace without the layercache.dev/max-cache-size annotation, as
	// a quantity such as "50Gi"; empty is no bound.
	NamespaceMaxCacheSize string
}

// DefaultOptions returns the options of a default install. The ports differ
// from the node agent's (8080, 8081) because both may share the host's
// network namespace.
func DefaultOptions() Options {
	return Options{
		MetricsBindAddress:     ":8082",
		HealthProbeBindAddress: ":8083",
		LeaderElect:            true,
		LeaderElectionID:       "layercache-manager.layercache.dev",
		CacheMaxAge:            DefaultCacheMaxAge,
	}
}

// AddFlags binds the options to command-line flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file; empty means in-cluster config, then $KUBECONFIG, then ~/.kube/config")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, `address of the Prometheus metrics endpoint, "0" to turn it off`)
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, `address of /healthz and /readyz, "0" to turn them off`)
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "elect one active manager among the replicas")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "namespace of the leader Lease; empty means the manager pod's namespace")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", o.LeaderElectionID, "name of the leader Lease")
	fs.DurationVar(&o.CacheMaxAge, "cache-max-age", o.CacheMaxAge, "delete a Cache that no node has used for this long, unless its spec.retention.clusterMaxAge or its StorageClass's clusterMaxAge says otherwise; 0 keeps Caches forever")
	fs.StringVar(&o.NamespaceMaxCacheSize, "namespace-max-cache-size", o.NamespaceMaxCacheSize, "bound on the total size of a namespace's caches (each counted by its largest node copy), such as 50Gi, for namespaces without the layercache.dev/max-cache-size annotation; past it the least recently used caches are deleted; empty means no bound")
}

// Lifecycle returns the validated lifecycle options.
func (o *Options) Lifecycle() (Lifecycle, error) {
	lc := Lifecycle{CacheMaxAge: o.CacheMaxAge}
	if o.CacheMaxAge < 0 {
		return lc, fmt.Errorf("--cache-max-age %s is negative: use a duration such as 720h, or 0 to keep caches forever", o.CacheMaxAge)
	}
	if o.NamespaceMaxCacheSize != "" {
		q, err := resource.ParseQuantity(o.NamespaceMaxCacheSize)
		if err != nil || q.Sign() <= 0 {
			return lc, fmt.Errorf("--namespace-max-cache-size %q: use a quantity above 0 such as 50Gi, or leave it empty for no bound", o.NamespaceMaxCacheSize)
		}
		lc.NamespaceMaxCacheSize = &q
	}
	return lc, nil
}

// Validate checks the options and says how to fix each bad one.
func (o *Options) Validate() error {
	var errs []error
	for _, a := range []struct{ flag, value string }{
		{"--metrics-bind-address", o.MetricsBindAddress},
		{"--health-probe-bind-address", o.HealthProbeBindAddress},
	} {
		if err := bootstrap.ValidateBindAddress(a.flag, a.value); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := o.Lifecycle(); err != nil {
		errs = append(errs, err)
	}
	if o.LeaderElect {
		if msgs := validation.IsDNS1123Subdomain(o.LeaderElectionID); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--leader-election-id %q: %s; use a DNS subdomain such as layercache-manager.layercache.dev", o.LeaderElectionID, strings.Join(msgs, "; ")))
		}
		if o.LeaderElectionNamespace != "" {
			if msgs := validation.IsDNS1123Label(o.LeaderElectionNamespace); len(msgs) > 0 {
				errs = append(errs, fmt.Errorf("--leader-election-namespace %q: %s; name an existing namespace such as layercache-system, or leave it empty for the pod's own", o.LeaderElectionNamespace, strings.Join(msgs, "; ")))
			}
		}
	}
	return errors.Join(errs...)
}

// Run runs the controllers until ctx is done. It expects validated options
// and a logger set with ctrl.SetLogger.
func Run(ctx context.Context, opts Options) error {
	lc, err := opts.Lifecycle()
	if err != nil {
		return err
	}
	cfg, err := bootstrap.RESTConfig(opts.Kubeconfig, Component)
	if err != nil {
		return err
	}
	scheme, err := bootstrap.Scheme()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   CacheOptions(),
		Metrics:                 metricsserver.Options{BindAddress: opts.MetricsBindAddress},
		HealthProbeBindAddress:  opts.HealthProbeBindAddress,
		LeaderElection:          opts.LeaderElect,
		LeaderElectionID:        opts.LeaderElectionID,
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		// The process exits right after the manager stops, so the next
		// leader need not wait for the lease to expire.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}
	if err := Setup(ctx, mgr, crmetrics.Registry, lc); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	log.FromContext(ctx).Info("starting the manager", "metrics", opts.MetricsBindAddress, "health", opts.HealthProbeBindAddress, "leaderElection", opts.LeaderElect,
		"cacheMaxAge", opts.CacheMaxAge, "namespaceMaxCacheSize", opts.NamespaceMaxCacheSize)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the controller manager: %w", err)
	}
	return nil
}
