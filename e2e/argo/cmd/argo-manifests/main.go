// Command argo-manifests writes the manifests of Argo Workflows' controller
// for the e2e cluster from the install manifests in its Go module (see
// package manifests); e2e/cluster/argo.sh applies its output:
//
//	argo-manifests --manifests "$(go env GOMODCACHE)/github.com/argoproj/argo-workflows/v3@v3.7.3/manifests" \
//	    --version v3.7.3 --image-prefix localhost/argo- --namespace argo \
//	    --host-network --apiserver 127.0.0.1:6443 > argo.yaml
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/layercache/layercache/e2e/argo/manifests"
)

type options struct {
	dir         string
	version     string
	imagePrefix string
	namespace   string
	user        int
	hostNetwork bool
	apiServer   string
}

func (o *options) manifests() (manifests.Options, error) {
	m := manifests.Options{
		ManifestsDir: o.dir,
		Version:      o.version,
		Namespace:    o.namespace,
		User:         o.user,
		HostNetwork:  o.hostNetwork,
		Image:        func(command string) string { return o.imagePrefix + command + ":" + o.version },
	}
	if o.imagePrefix == "" {
		return m, fmt.Errorf("--image-prefix is required, e.g. localhost/argo- (the images are PREFIX<command>:VERSION)")
	}
	if o.hostNetwork {
		host, port, err := net.SplitHostPort(o.apiServer)
		if err != nil {
			return m, fmt.Errorf("--apiserver %q: want HOST:PORT, e.g. 127.0.0.1:6443: %w", o.apiServer, err)
		}
		m.APIServerHost, m.APIServerPort = host, port
	}
	return m, m.Validate()
}

func newCommand() *cobra.Command {
	o := &options{}
	c := &cobra.Command{
		Use:          "argo-manifests",
		Short:        "Write Argo Workflows' controller manifests for the e2e cluster from its module's manifests/",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(c *cobra.Command, _ []string) error {
			m, err := o.manifests()
			if err != nil {
				return err
			}
			return run(c.Context(), c.OutOrStdout(), m)
		},
	}
	f := c.Flags()
	f.StringVar(&o.dir, "manifests", "", "manifests/ directory of the module github.com/argoproj/argo-workflows/v3")
	f.StringVar(&o.version, "version", "", "the release, e.g. v3.7.3")
	f.StringVar(&o.imagePrefix, "image-prefix", "", "images are PREFIX<command>:VERSION, e.g. localhost/argo-")
	f.StringVar(&o.namespace, "namespace", "argo", "the controller's namespace")
	f.IntVar(&o.user, "user", 8737, "numeric user of the controller (upstream's image user)")
	f.BoolVar(&o.hostNetwork, "host-network", false, "run the controller and workflow pods on the host network (a cluster without kube-proxy or pod routes)")
	f.StringVar(&o.apiServer, "apiserver", "127.0.0.1:6443", "with --host-network: where the API server listens")
	return c
}

func run(_ context.Context, out io.Writer, m manifests.Options) error {
	return manifests.Write(out, m)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}
