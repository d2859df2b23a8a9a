package main

import "github.com/spf13/cobra"

// Placeholder until the manager lands; replaced by its owner.
func newManagerCommand() *cobra.Command {
	return &cobra.Command{Use: "manager", Short: "Run the controllers"}
}
