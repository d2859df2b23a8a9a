package main

import (
	"context"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/layercache/layercache/nodeagent"
)

func newNodeCommand() *cobra.Command {
	opts := nodeagent.DefaultOptions()
	var logOpts zap.Options
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
			return runLogged(cmd.Context(), &logOpts, func(ctx context.Context) error {
				return nodeagent.Run(ctx, opts)
			})
		},
	}
	opts.AddFlags(cmd.Flags())
	addLogFlags(cmd, &logOpts)
	return cmd
}
