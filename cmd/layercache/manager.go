package main

import (
	"flag"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/layercache/layercache/manager"
)

func newManagerCommand() *cobra.Command {
	opts := manager.DefaultOptions()
	var zapOpts zap.Options
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
			logger := zap.New(zap.UseFlagOptions(&zapOpts))
			ctrllog.SetLogger(logger)
			// client-go's leader election logs through klog.
			klog.SetLogger(logger)
			return manager.Run(logr.NewContext(cmd.Context(), logger), opts)
		},
	}
	opts.AddFlags(cmd.Flags())
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	cmd.Flags().AddGoFlagSet(logFlags)
	return cmd
}
