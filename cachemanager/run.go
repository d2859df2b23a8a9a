package cachemanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

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
}

// Validate checks the options and says how to fix each bad one.
func (o *Options) Validate() error {
	var errs []error
	for _, a := range []struct{ flag, value string }{
		{"--metrics-bind-address", o.MetricsBindAddress},
		{"--health-probe-bind-address", o.HealthProbeBindAddress},
	} {
		if err := validateBindAddress(a.value); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w; use HOST:PORT or :PORT (for example :8082), or 0 to turn it off", a.flag, a.value, err))
		}
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

func validateBindAddress(addr string) error {
	if addr == "0" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// Run runs the controllers until ctx is done. It expects validated options
// and a logger set with ctrl.SetLogger.
func Run(ctx context.Context, opts Options) error {
	cfg, err := restConfig(opts.Kubeconfig)
	if err != nil {
		return err
	}
	scheme, err := Scheme()
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
	if err := Setup(ctx, mgr); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	log.FromContext(ctx).Info("starting the manager", "metrics", opts.MetricsBindAddress, "health", opts.HealthProbeBindAddress, "leaderElection", opts.LeaderElect)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the controller manager: %w", err)
	}
	return nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("finding the API server: %w; run in a pod, or set --kubeconfig or $KUBECONFIG", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading --kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
