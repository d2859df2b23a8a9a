package main

import (
	"context"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/layercache/layercache/cachemanager"
)

func newManagerCommand() *cobra.Command {
	opts := cachemanager.DefaultOptions()
	var logOpts zap.Options
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the cluster-wide controllers (a Deployment)",
		Long: `Run the layercache controllers: when the pods that used a layercache claim
have ended, record their outcome on its volume and release the claim so the
node agent commits it; keep each Cache's summary status and clear deleted
Caches once every node agent has removed them. Replicas elect one leader.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.Validate(); err != nil {
				return err
			}
			return runLogged(cmd.Context(), &logOpts, func(ctx context.Context) error {
				return cachemanager.Run(ctx, opts)
			})
		},
	}
	opts.AddFlags(cmd.Flags())
	addLogFlags(cmd, &logOpts)
	return cmd
}
