// Command layercache runs the cluster side of layercache: `layercache node`
// (the per-node provisioner, a DaemonSet) and `layercache manager` (the
// controllers, a Deployment).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "layercache:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "layercache",
		Short:         "Warm, named build caches for Kubernetes pods",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newNodeCommand(), newManagerCommand(), newLazyfsCommand())
	return root
}

// addLogFlags adds the zap logging flags (--zap-log-level, ...).
func addLogFlags(cmd *cobra.Command, opts *zap.Options) {
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	opts.BindFlags(logFlags)
	cmd.Flags().AddGoFlagSet(logFlags)
}

// runLogged runs fn with one logger for everything: controller-runtime,
// and klog, through which client-go's leader election and the provisioner
// library log.
func runLogged(ctx context.Context, opts *zap.Options, fn func(context.Context) error) error {
	logger := zap.New(zap.UseFlagOptions(opts))
	ctrllog.SetLogger(logger)
	klog.SetLogger(logger)
	return fn(logr.NewContext(ctx, logger))
}
