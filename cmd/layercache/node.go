package main

import "github.com/spf13/cobra"

// Placeholder until the provisioner lands; replaced by its owner.
func newNodeCommand() *cobra.Command {
	return &cobra.Command{Use: "node", Short: "Run the per-node provisioner"}
}
