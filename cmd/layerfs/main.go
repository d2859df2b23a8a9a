// Command layerfs is the operator's tool for one node's layercache store:
// mount and commit volumes by hand, list and inspect caches, squash deep
// caches, collect garbage and repair the store after a crash. It works on the
// same store as the node agent, under the same locks, so both may run at once.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/layercache/layercache/layerfs"
)

// Exit statuses. Scripts tell "you called me wrong" apart from "the store
// could not do it", so usage errors never share a status with failures.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// exitStatusHelp ends every command's help so that the statuses are
// documented where a script author looks for them.
const exitStatusHelp = `

Exit status: 0 on success, 1 when the operation failed, 2 on a usage error
(unknown command or flag, wrong arguments, a bad flag value).`

// rootEnv overrides the default store root; --root overrides both.
const rootEnv = "LAYERFS_ROOT"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The store leaves every cache consistent at any instant, so a second
	// Ctrl-C may kill the process outright instead of waiting for a clean stop.
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the CLI with args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newRootCommand(os.Getenv)
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "layerfs: %v\n", err)
	var usageErr *usageError
	switch {
	case errors.As(err, &usageErr):
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", usageErr.command)
		return exitUsage
	case errors.Is(err, layerfs.ErrNotFound):
		fmt.Fprintln(stderr, "Run 'layerfs ls' to list caches, 'layerfs ls --volumes' to list volumes.")
	}
	return exitFailure
}

// usageError marks an error as the caller's mistake (exit status 2) and
// remembers which command's help to point at.
type usageError struct {
	command string
	err     error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usage(cmd *cobra.Command, err error) error {
	return &usageError{command: cmd.CommandPath(), err: err}
}

// globalOptions are the flags every command shares.
type globalOptions struct {
	root   string
	getenv func(string) string
	// Where snapshot caches live on a root that is not btrfs: the size of
	// the sparse image layerfs makes, and the mkfs.btrfs that formats it.
	snapshotImageSize quantityValue
	mkfsBtrfs         string
}

// resolveRoot applies the precedence --root, then $LAYERFS_ROOT, then the
// default, and makes the result absolute because overlay mount options and
// the printed paths must not depend on the working directory.
func (g *globalOptions) resolveRoot(flagSet bool) error {
	if !flagSet {
		g.root = layerfs.DefaultRoot
		if env := g.getenv(rootEnv); env != "" {
			g.root = env
		}
	}
	if g.root == "" {
		return fmt.Errorf("--root is empty; give the store's directory, for example --root %s", layerfs.DefaultRoot)
	}
	abs, err := filepath.Abs(g.root)
	if err != nil {
		return fmt.Errorf("--root %q: %w", g.root, err)
	}
	g.root = abs
	return nil
}

// open opens the store; progress, if not nil, receives progress of long
// operations.
func (g *globalOptions) open(ctx context.Context, progress func(layerfs.Progress)) (*layerfs.Store, error) {
	return layerfs.Open(ctx, layerfs.Options{
		Root: g.root, Progress: progress,
		SnapshotImageBytes: g.snapshotImageSize.bytes, MkfsBtrfs: g.mkfsBtrfs,
	})
}

func newRootCommand(getenv func(string) string) *cobra.Command {
	g := &globalOptions{getenv: getenv}
	root := &cobra.Command{
		Use:   "layerfs",
		Short: "Manage a node's layercache store: volumes, caches, squash, gc, recover",
		Long: `layerfs manages the node-local store of layercache: named caches made of
immutable overlayfs layers, and volumes that are copy-on-write views of them.

It works on the same store as the node agent and takes the same locks, so it
is safe to use on a live node. The store root is --root, else $` + rootEnv + `,
else ` + layerfs.DefaultRoot + `.` + exitStatusHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		// cobra sets this default only on its own unknown-command path.
		SuggestionsMinimumDistance: 2,
		// Runnable with its own Args check, so that an unknown command is a
		// usage error (exit status 2) instead of cobra's plain error.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usage(cmd, fmt.Errorf("missing command; choose one of: %s", strings.Join(commandNames(cmd), ", ")))
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf("; did you mean %s?", strings.Join(s, " or "))
			} else {
				msg += fmt.Sprintf("; choose one of: %s", strings.Join(commandNames(cmd), ", "))
			}
			return usage(cmd, errors.New(msg))
		},
		RunE: func(cmd *cobra.Command, args []string) error { return nil },
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := g.resolveRoot(cmd.Flags().Changed("root")); err != nil {
				return usage(cmd, err)
			}
			return nil
		},
	}
	root.PersistentFlags().StringVar(&g.root, "root", layerfs.DefaultRoot, "store root directory (env "+rootEnv+")")
	g.snapshotImageSize.text = "0"
	root.PersistentFlags().Var(&g.snapshotImageSize, "snapshot-image-size", "size of the sparse btrfs image made for snapshot caches when the root is not on btrfs (0: 20Gi)")
	root.PersistentFlags().StringVar(&g.mkfsBtrfs, "mkfs-btrfs", "mkfs.btrfs", "mkfs.btrfs program that formats that image")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usage(cmd, err) })
	root.AddCommand(
		newMountCommand(g),
		newCommitCommand(g),
		newDiscardCommand(g),
		newLsCommand(g),
		newInspectCommand(g),
		newSquashCommand(g),
		newGCCommand(g),
		newRmCommand(g),
		newRecoverCommand(g),
	)
	// cobra's completion command would be the only one without our exit
	// status contract; shells are not this tool's audience.
	root.CompletionOptions.DisableDefaultCmd = true
	return root
}

func commandNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return names
}

// wantArgs checks the positional arguments against their names, so that the
// error says which argument is missing or extra.
func wantArgs(args []string, names ...string) error {
	switch {
	case len(args) < len(names):
		return fmt.Errorf("missing argument %s", names[len(args)])
	case len(args) > 0 && len(names) == 0:
		return fmt.Errorf("unexpected argument %q; this command takes none", args[0])
	case len(args) > len(names):
		return fmt.Errorf("unexpected argument %q; want only %s", args[len(names)], strings.Join(names, " "))
	}
	return nil
}
