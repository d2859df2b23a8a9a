package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/layerfs/lazyfs"
)

func newLazyfsCommand() *cobra.Command {
	root := layerfs.DefaultRoot
	wait := lazyfs.DefaultAgentWait
	var logOpts zap.Options
	cmd := &cobra.Command{
		Use:   "lazyfs",
		Short: "Serve the node's lazily fetched layers for its agent (a container of the agent's pod)",
		Long: `Serve the lazyfs of the layer store at --root: the files that the loop
devices of layers mounted before their bytes are here read. The node agent
(run with --lazyfs-sidecar) fetches their bytes; this process outlives it, so
that a build reading such a layer waits for a restarted agent (up to
--agent-wait) instead of failing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if wait <= 0 {
				return fmt.Errorf("--agent-wait %s must be positive, e.g. 2m", wait)
			}
			return runLogged(cmd.Context(), &logOpts, func(ctx context.Context) error {
				cfg := layerfs.LazyfsSidecar(root)
				cfg.Wait = wait
				log := logr.FromContextOrDiscard(ctx).WithName("lazyfs")
				s, err := lazyfs.ServeSidecar(cfg, log)
				if err != nil {
					return err
				}
				log.Info("Serving the lazyfs", "dir", cfg.Dir, "socket", cfg.Control)
				<-ctx.Done()
				// The pod is ending: serve the agent's last reads until
				// it has stopped (it ends its part at its exit).
				s.WaitForAgentExit(50 * time.Second)
				return s.Close()
			})
		},
	}
	cmd.Flags().StringVar(&root, "root", root, "the node agent's --root")
	cmd.Flags().DurationVar(&wait, "agent-wait", wait, "how long a read waits for a node agent to answer before it fails")
	addLogFlags(cmd, &logOpts)
	return cmd
}
