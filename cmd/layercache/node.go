package main

import (
	"flag"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/layercache/layercache/provisioner"
)

func newNodeCommand() *cobra.Command {
	opts := provisioner.DefaultOptions()
	var zapOpts zap.Options
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run the per-node provisioner (a DaemonSet)",
		Long: `Run the layercache agent of one node: provision the layercache claims the
scheduler placed on this node as copy-on-write views of their cache, commit or
discard them when they are released, and report each cache's state on this
node in its Cache resource.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.Validate(); err != nil {
				return err
			}
			logger := zap.New(zap.UseFlagOptions(&zapOpts))
			ctrllog.SetLogger(logger)
			// The provisioner library logs through klog.
			klog.SetLogger(logger)
			return provisioner.Run(logr.NewContext(cmd.Context(), logger), opts)
		},
	}
	opts.AddFlags(cmd.Flags())
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	cmd.Flags().AddGoFlagSet(logFlags)
	return cmd
}
