// Package bootstrap is what layercache's two processes, `layercache node`
// and `layercache manager`, set up the same way: the API server's
// address, the scheme, the Events recorder and the listen addresses of
// their endpoints. (Events come from controller-runtime's manager in both:
// events.k8s.io Events.) The e2e framework uses it too, so tests reach the API
// server as the processes do.
package bootstrap

import (
	"fmt"
	"net"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/layercache/layercache/api/v1alpha1"
)

// RESTConfig finds the API server: the kubeconfig file if one is given,
// else controller-runtime's order ($KUBECONFIG, the in-cluster config,
// ~/.kube/config). userAgent names the process in the API server's logs
// and audit records.
func RESTConfig(kubeconfig, userAgent string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("load --kubeconfig %s: %w", kubeconfig, err)
		}
	} else if cfg, err = ctrl.GetConfig(); err != nil {
		return nil, fmt.Errorf("find the API server: %w; run in a pod, or set --kubeconfig or $KUBECONFIG", err)
	}
	if cfg.QPS == 0 {
		// As ctrl.GetConfig does in a pod: no client-side rate limit, the
		// API server's priority and fairness governs. client-go's default
		// of 5 requests a second would queue the API writes of 50 builds
		// that end at once.
		cfg.QPS = -1
	}
	cfg.UserAgent = userAgent
	return cfg, nil
}

// Scheme knows the built-in kinds and layercache's.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build the scheme: %w", err)
		}
	}
	return s, nil
}

// ValidateBindAddress accepts "0" (the endpoint is off) or HOST:PORT with
// a port from 1 to 65535. Port 0 (any free port) is refused: nothing could
// find the endpoint.
func ValidateBindAddress(flag, addr string) error {
	if addr == "0" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 {
			err = fmt.Errorf("port %q is not a number from 1 to 65535", port)
		}
	}
	if err != nil {
		return fmt.Errorf("%s %q: %w; use HOST:PORT or :PORT (for example :8080), or 0 to turn it off", flag, addr, err)
	}
	return nil
}
