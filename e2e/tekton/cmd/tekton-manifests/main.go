// Command tekton-manifests writes the manifests of Tekton Pipelines for the
// e2e cluster from the release configuration in its Go module (see package
// manifests); e2e/cluster/tekton.sh applies its output:
//
//	tekton-manifests --config "$(go env GOMODCACHE)/github.com/tektoncd/pipeline@v1.6.0/config" \
//	    --version v1.6.0 --image-prefix localhost/tekton- --shell-image localhost/busybox:e2e \
//	    --host-network --apiserver 127.0.0.1:6443 > tekton.yaml
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

	"github.com/layercache/layercache/e2e/tekton/manifests"
)

type options struct {
	config      string
	version     string
	imagePrefix string
	shellImage  string
	pullPolicy  string
	hostNetwork bool
	apiServer   string
	webhookHost string
}

func (o *options) manifests() (manifests.Options, error) {
	m := manifests.Options{
		ConfigDir:   o.config,
		Version:     o.version,
		ShellImage:  o.shellImage,
		PullPolicy:  o.pullPolicy,
		HostNetwork: o.hostNetwork,
		WebhookHost: o.webhookHost,
		Ports:       manifests.LocalPorts,
		Image:       func(command string) string { return o.imagePrefix + command + ":" + o.version },
	}
	if o.imagePrefix == "" {
		return m, fmt.Errorf("--image-prefix is required, e.g. localhost/tekton- (the images are PREFIX<command>:VERSION)")
	}
	switch o.pullPolicy {
	case "", "Never", "IfNotPresent", "Always":
	default:
		return m, fmt.Errorf("--pull-policy %q: want Never, IfNotPresent or Always", o.pullPolicy)
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
		Use:          "tekton-manifests",
		Short:        "Write Tekton Pipelines' manifests for the e2e cluster from its module's config/",
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
	f.StringVar(&o.config, "config", "", "config/ directory of the module github.com/tektoncd/pipeline")
	f.StringVar(&o.version, "version", "", "the release, e.g. v1.6.0")
	f.StringVar(&o.imagePrefix, "image-prefix", "", "images are PREFIX<command>:VERSION, e.g. localhost/tekton-")
	f.StringVar(&o.shellImage, "shell-image", "", "image with sh for steps with a script, e.g. localhost/busybox:e2e")
	f.StringVar(&o.pullPolicy, "pull-policy", "", "imagePullPolicy of the controller and the webhook (Never for imported images)")
	f.BoolVar(&o.hostNetwork, "host-network", false, "run the controller and the webhook on the host network (a cluster without kube-proxy or pod routes)")
	f.StringVar(&o.apiServer, "apiserver", "127.0.0.1:6443", "with --host-network: where the API server listens")
	f.StringVar(&o.webhookHost, "webhook-host", "localhost", "with --host-network: the host name the API server dials for the webhook")
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
