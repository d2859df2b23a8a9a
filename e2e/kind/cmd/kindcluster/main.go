// Command kindcluster is the kind backend of e2e/cluster/up.sh and down.sh:
//
//	kindcluster up --nodes 2 --kubeconfig $PWD/_output/cluster/kubeconfig --image-archive a.tar ...
//	kindcluster down --kubeconfig $PWD/_output/cluster/kubeconfig
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	kindcmd "sigs.k8s.io/kind/pkg/cmd"

	"github.com/layercache/layercache/e2e/kind"
)

func newCommand() *cobra.Command {
	root := &cobra.Command{Use: "kindcluster", Short: "The e2e cluster on kind (needs a Docker engine)", SilenceUsage: true}
	logger := kindcmd.NewLogger()

	up := kind.Options{Name: kind.DefaultName, Nodes: 1}
	upCmd := &cobra.Command{
		Use:   "up",
		Short: "Create the cluster (if missing) and load the image archives into every node",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := up.Validate(); err != nil {
				return err
			}
			return kind.Up(c.Context(), logger, up)
		},
	}
	upCmd.Flags().StringVar(&up.Name, "name", up.Name, "kind cluster name")
	upCmd.Flags().IntVar(&up.Nodes, "nodes", up.Nodes, "number of schedulable nodes")
	upCmd.Flags().StringVar(&up.NodeImage, "node-image", "", "kindest/node image (default: kind's)")
	upCmd.Flags().StringVar(&up.Kubeconfig, "kubeconfig", "", "kubeconfig file to write (absolute)")
	upCmd.Flags().StringArrayVar(&up.ImageArchives, "image-archive", nil, "image archive to load into every node (repeatable)")

	var name, kubeconfig string
	downCmd := &cobra.Command{
		Use:   "down",
		Short: "Delete the cluster",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return kind.Down(logger, name, kubeconfig)
		},
	}
	downCmd.Flags().StringVar(&name, "name", kind.DefaultName, "kind cluster name")
	downCmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file to remove the cluster from")

	root.AddCommand(upCmd, downCmd)
	return root
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}
