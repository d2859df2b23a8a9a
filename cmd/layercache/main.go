// Command layercache runs the cluster side of layercache: `layercache node`
// (the per-node provisioner, a DaemonSet) and `layercache manager` (the
// controllers, a Deployment).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
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
	root.AddCommand(newNodeCommand(), newManagerCommand())
	return root
}
