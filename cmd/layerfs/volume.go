package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/layercache/layercache/layerfs"
)

type mountOptions struct {
	cache                     string
	readOnly                  bool
	uid, gid                  int
	mode                      string
	writer                    string
	allowSetuid, allowDevices bool
	layout                    string
	fallbacks                 []string
}

func newMountCommand(g *globalOptions) *cobra.Command {
	o := &mountOptions{}
	cmd := &cobra.Command{
		Use:   "mount VOLUME --cache NAMESPACE/NAME",
		Short: "Create a volume of a cache and print its merged path",
		Long: `Create VOLUME as a copy-on-write view of a cache and print the path where
it is mounted. The volume sees the cache's committed layers; what is written
to it stays private until 'layerfs commit'. An unknown cache starts empty.
Mounting an existing volume again prints its path and changes nothing.` + exitStatusHelp,
		Example: `  dir=$(layerfs mount build-42 --cache ci/maven --uid 1000 --gid 1000)
  layerfs mount pr-7 --cache ci/maven --read-only
  layerfs mount pr-7-build --cache ci/pr-7 --fallback ci/main`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			volumeID, opts, err := o.validate(args)
			if err != nil {
				return usage(cmd, err)
			}
			store, err := g.open(cmd.Context(), nil)
			if err != nil {
				return err
			}
			return runMount(cmd.Context(), cmd.OutOrStdout(), store, volumeID, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.cache, "cache", "", "cache the volume is a view of, as NAMESPACE/NAME (required)")
	f.BoolVar(&o.readOnly, "read-only", false, "never commit this volume (it is still writable scratch space)")
	f.IntVar(&o.uid, "uid", 0, "owner of the volume's root directory")
	f.IntVar(&o.gid, "gid", 0, "group of the volume's root directory")
	f.StringVar(&o.mode, "mode", "0777", "octal mode of the volume's root directory")
	f.StringVar(&o.writer, "writer", "", "who uses the volume (for example NAMESPACE/POD), recorded as the cache's last writer")
	f.BoolVar(&o.allowSetuid, "allow-setuid", false, "mount without nosuid, for a cache that must hold working set-id programs")
	f.BoolVar(&o.allowDevices, "allow-devices", false, "mount without nodev, for a cache that must hold usable device nodes")
	f.StringVar(&o.layout, "layout", "", "layout of a new cache: overlay (default) or snapshot (btrfs subvolumes); an existing cache keeps its own")
	f.StringSliceVar(&o.fallbacks, "fallback", nil, "NAMESPACE/NAME of a cache to start from while --cache has no generation (repeatable, tried in order, at most 5; of the cache's layout)")
	return cmd
}

func (o *mountOptions) validate(args []string) (string, layerfs.MountOptions, error) {
	volumeID, err := volumeArg(args)
	if err != nil {
		return "", layerfs.MountOptions{}, err
	}
	if o.cache == "" {
		return "", layerfs.MountOptions{}, fmt.Errorf("--cache is required; name the cache as NAMESPACE/NAME, for example --cache default/maven")
	}
	cache, err := layerfs.ParseCacheRef(o.cache)
	if err != nil {
		return "", layerfs.MountOptions{}, fmt.Errorf("--cache: %w", err)
	}
	// Checked here, not only by the store: chown(2) takes 32-bit ids, and
	// --uid 4294967296 would silently become uid 0.
	if o.uid < 0 || o.gid < 0 || o.uid > layerfs.MaxID || o.gid > layerfs.MaxID {
		return "", layerfs.MountOptions{}, fmt.Errorf("--uid %d --gid %d: ids must be from 0 to %d", o.uid, o.gid, layerfs.MaxID)
	}
	mode, err := parseMode(o.mode)
	if err != nil {
		return "", layerfs.MountOptions{}, err
	}
	opts := layerfs.MountOptions{
		Cache:    cache,
		ReadOnly: o.readOnly,
		UID:      o.uid,
		GID:      o.gid,
		Mode:     mode,
		Writer:   o.writer,

		AllowSetuid:  o.allowSetuid,
		AllowDevices: o.allowDevices,
	}
	if o.layout != "" {
		if opts.Layout, err = layerfs.ParseLayout(o.layout); err != nil {
			return "", layerfs.MountOptions{}, fmt.Errorf("--layout: %w", err)
		}
	}
	for _, f := range o.fallbacks {
		ref, err := layerfs.ParseCacheRef(f)
		if err != nil {
			return "", layerfs.MountOptions{}, fmt.Errorf("--fallback: %w", err)
		}
		opts.Fallbacks = append(opts.Fallbacks, ref)
	}
	if len(opts.Fallbacks) > 0 {
		fallbacks := opts
		fallbacks.Mode = 0
		if err := fallbacks.Validate(); err != nil {
			return "", layerfs.MountOptions{}, fmt.Errorf("--fallback: %w", err)
		}
	}
	// The store's own check, so that what it refuses is a usage error here.
	if err := opts.Validate(); err != nil {
		return "", layerfs.MountOptions{}, fmt.Errorf("--mode %s: %w", o.mode, err)
	}
	return volumeID, opts, nil
}

// parseMode parses an octal mode such as 0777, 755 or 01777. Go keeps the
// setuid, setgid and sticky bits apart from the permission bits, so they are
// moved to their os.FileMode places.
func parseMode(s string) (os.FileMode, error) {
	digits := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	bits, err := strconv.ParseUint(digits, 8, 32)
	if err != nil || bits > 0o7777 {
		return 0, fmt.Errorf("--mode %q is not an octal file mode; use for example 0777, 0755, 02775 or 01777", s)
	}
	if bits == 0 {
		// The store reads a zero mode as "default 0777"; refuse it rather
		// than give the caller the opposite of what was asked.
		return 0, fmt.Errorf("--mode %q would leave the volume unusable; use for example 0777 or 0700", s)
	}
	mode := os.FileMode(bits & 0o777)
	if bits&0o4000 != 0 {
		mode |= os.ModeSetuid
	}
	if bits&0o2000 != 0 {
		mode |= os.ModeSetgid
	}
	if bits&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	return mode, nil
}

func runMount(ctx context.Context, w io.Writer, store *layerfs.Store, volumeID string, opts layerfs.MountOptions) error {
	vol, err := store.Mount(ctx, volumeID, opts)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, vol.MergedPath)
	return err
}

func newCommitCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "commit VOLUME",
		Short: "Commit a volume as its cache's newest layer and print the generation",
		Long: `Unmount VOLUME, turn what was written to it into the newest layer of its
cache, and print the cache's generation. A volume without changes adds no
layer; the unchanged generation is printed and a note goes to stderr. If the
cache was removed while the volume was in use, the changes are dropped as
the removal asked. A failed commit keeps the volume's changes; fix the cause
and commit again.` + exitStatusHelp,
		Example: `  gen=$(layerfs commit build-42)`,
		Args:    cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			volumeID, err := volumeArg(args)
			if err != nil {
				return usage(cmd, err)
			}
			store, err := g.open(cmd.Context(), nil)
			if err != nil {
				return err
			}
			return runCommit(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), store, volumeID)
		},
	}
}

func runCommit(ctx context.Context, stdout, stderr io.Writer, store *layerfs.Store, volumeID string) error {
	res, err := store.Commit(ctx, volumeID)
	if err != nil {
		return err
	}
	return reportCommit(stdout, stderr, volumeID, res)
}

// reportCommit prints the generation on stdout, always, so that scripts can
// read it, and what else happened on stderr.
func reportCommit(stdout, stderr io.Writer, volumeID string, res layerfs.CommitResult) error {
	switch {
	case res.Torn:
		fmt.Fprintf(stderr, "layerfs: volume %s was mounted when the node went down, so its changes may be torn; it was discarded and cache %s stays at generation %d\n", volumeID, res.Cache, res.Generation)
	case res.Dropped:
		fmt.Fprintf(stderr, "layerfs: cache %s was removed while volume %s was in use; its changes were dropped\n", res.Cache, volumeID)
	case res.Layer == "":
		fmt.Fprintf(stderr, "layerfs: volume %s had no changes; cache %s stays at generation %d\n", volumeID, res.Cache, res.Generation)
	case res.SeededFrom != nil:
		fmt.Fprintf(stderr, "layerfs: cache %s was created on the layers of fallback %s, shared with it\n", res.Cache, res.SeededFrom)
	case res.NeedsSquash:
		fmt.Fprintf(stderr, "layerfs: cache %s has more layers than the squash limit; run 'layerfs squash %s'\n", res.Cache, res.Cache)
	}
	_, err := fmt.Fprintln(stdout, res.Generation)
	return err
}

func newDiscardCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "discard VOLUME",
		Short: "Unmount a volume and throw away its changes",
		Long: `Unmount VOLUME and remove it with everything written to it. The cache is
not changed. Prints the volume's name.` + exitStatusHelp,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			volumeID, err := volumeArg(args)
			if err != nil {
				return usage(cmd, err)
			}
			store, err := g.open(cmd.Context(), nil)
			if err != nil {
				return err
			}
			return runDiscard(cmd.Context(), cmd.OutOrStdout(), store, volumeID)
		},
	}
}

func runDiscard(ctx context.Context, w io.Writer, store *layerfs.Store, volumeID string) error {
	if err := store.Discard(ctx, volumeID); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, volumeID)
	return err
}

// volumeArg checks the one positional argument VOLUME.
func volumeArg(args []string) (string, error) {
	if err := wantArgs(args, "VOLUME"); err != nil {
		return "", err
	}
	return args[0], layerfs.ValidateName("volume", args[0])
}
