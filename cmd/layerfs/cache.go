package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

type lsOptions struct {
	output  string
	quiet   bool
	volumes bool
}

func newLsCommand(g *globalOptions) *cobra.Command {
	o := &lsOptions{}
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List caches, or volumes with --volumes",
		Long: `List the store's caches with their generation, layer count, size, last use
and the number of volumes using them. Once a cache was seeded from a
fallback, SEEDED FROM names that fallback and SHARED counts the cache's
layers that another cache's head also names (stored once). With --volumes, list the volumes with
their cache, the generation they were mounted at, and whether the overlay is
mounted.` + exitStatusHelp,
		Example: `  layerfs ls
  layerfs ls -o json
  layerfs ls --volumes -q`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := o.validate(args, cmd.Flags().Changed("output"))
			if err != nil {
				return usage(cmd, err)
			}
			store, err := g.open(cmd.Context(), nil)
			if err != nil {
				return err
			}
			if o.volumes {
				return runListVolumes(cmd.Context(), cmd.OutOrStdout(), store, format)
			}
			return runListCaches(cmd.Context(), cmd.OutOrStdout(), store, format, time.Now())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.output, "output", "o", outputTable, "output format: table, json or name")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "print names only (same as -o name)")
	f.BoolVar(&o.volumes, "volumes", false, "list volumes instead of caches")
	return cmd
}

// validate returns the output format to use.
func (o *lsOptions) validate(args []string, outputSet bool) (string, error) {
	if err := wantArgs(args); err != nil {
		return "", err
	}
	if err := checkOutput(o.output, outputJSON, outputName, outputTable); err != nil {
		return "", err
	}
	if !o.quiet {
		return o.output, nil
	}
	if outputSet && o.output != outputName {
		return "", fmt.Errorf("--quiet prints names only and cannot be combined with -o %s; drop one of them", o.output)
	}
	return outputName, nil
}

func runListCaches(ctx context.Context, w io.Writer, store *layerfs.Store, format string, now time.Time) error {
	caches, err := store.List(ctx)
	if err != nil {
		return err
	}
	return writeCaches(w, format, caches, now)
}

func writeCaches(w io.Writer, format string, caches []layerfs.CacheInfo, now time.Time) error {
	caches = slices.SortedFunc(slices.Values(caches), func(a, b layerfs.CacheInfo) int {
		return cmp.Compare(a.Cache.String(), b.Cache.String())
	})
	heads := layerHeads(caches)
	switch format {
	case outputJSON:
		rows := make([]cacheRow, 0, len(caches)) // [] rather than null for jq users
		for _, c := range caches {
			rows = append(rows, cacheRow{CacheInfo: c, SharedLayers: sharedLayers(c, heads)})
		}
		return writeJSON(w, rows)
	case outputName:
		for _, c := range caches {
			if _, err := fmt.Fprintln(w, c.Cache); err != nil {
				return err
			}
		}
		return nil
	}
	t := newTable(w)
	// The LAYOUT column shows once a store holds a cache of another
	// layout than overlay, so the table of an overlay-only node (and what
	// reads it) stays as it was.
	layouts := slices.ContainsFunc(caches, func(c layerfs.CacheInfo) bool { return layoutName(c.Layout) != string(layerfs.LayoutOverlay) })
	header := "CACHE\tGENERATION\tLAYERS\tSIZE\tLAST USED\tVOLUMES"
	if layouts {
		header += "\tLAYOUT"
	}
	// SEEDED FROM and SHARED show once a cache was seeded from a
	// fallback or shares layers with another, likewise.
	seeded := slices.ContainsFunc(caches, func(c layerfs.CacheInfo) bool { return c.SeededFrom != nil || sharedLayers(c, heads) > 0 })
	if seeded {
		header += "\tSEEDED FROM\tSHARED"
	}
	fmt.Fprintln(t, header)
	for _, c := range caches {
		fmt.Fprintf(t, "%s\t%d\t%d\t%s\t%s\t%d",
			c.Cache, c.Generation, len(c.Layers), v1alpha1.FormatSize(c.Bytes), formatAge(c.LastUsed, now), len(c.Volumes))
		if layouts {
			fmt.Fprintf(t, "\t%s", layoutName(c.Layout))
		}
		if seeded {
			fmt.Fprintf(t, "\t%s\t%d", seedName(c.SeededFrom), sharedLayers(c, heads))
		}
		fmt.Fprintln(t)
	}
	return t.Flush()
}

func runListVolumes(ctx context.Context, w io.Writer, store *layerfs.Store, format string) error {
	volumes, err := store.Volumes(ctx)
	if err != nil {
		return err
	}
	return writeVolumes(w, format, volumes)
}

func writeVolumes(w io.Writer, format string, volumes []layerfs.Volume) error {
	volumes = slices.SortedFunc(slices.Values(volumes), func(a, b layerfs.Volume) int {
		return cmp.Compare(a.ID, b.ID)
	})
	switch format {
	case outputJSON:
		if volumes == nil {
			volumes = []layerfs.Volume{}
		}
		return writeJSON(w, volumes)
	case outputName:
		for _, v := range volumes {
			if _, err := fmt.Fprintln(w, v.ID); err != nil {
				return err
			}
		}
		return nil
	}
	t := newTable(w)
	fmt.Fprintln(t, "VOLUME\tCACHE\tBASE\tMOUNTED\tPATH")
	for _, v := range volumes {
		fmt.Fprintf(t, "%s\t%s\t%d\t%s\t%s\n", v.ID, v.Cache, v.BaseGeneration, yesNo(v.Mounted), v.MergedPath)
	}
	return t.Flush()
}

type inspectOptions struct {
	output string
	volume string
}

func newInspectCommand(g *globalOptions) *cobra.Command {
	o := &inspectOptions{}
	cmd := &cobra.Command{
		Use:   "inspect NAMESPACE/NAME | inspect --volume VOLUME",
		Short: "Show a cache's layers, or a volume and its mount command",
		Long: `Show a cache: its generation, size, last use and writer, the volumes using
it, and its layers newest first; once a layer is shared with other caches
(a cache seeded from a fallback and that fallback), SHARED WITH names them.

With --volume, show a volume instead, together with the equivalent
'mount -t overlay' command line: run it by hand to see the kernel's own
error when a mount fails.` + exitStatusHelp,
		Example: `  layerfs inspect ci/maven
  layerfs inspect ci/maven -o json | jq .generation
  layerfs inspect --volume build-42`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cache, err := o.validate(args)
			if err != nil {
				return usage(cmd, err)
			}
			store, err := g.open(cmd.Context(), nil)
			if err != nil {
				return err
			}
			if o.volume != "" {
				return runInspectVolume(cmd.Context(), cmd.OutOrStdout(), store, o.volume, o.output)
			}
			return runInspectCache(cmd.Context(), cmd.OutOrStdout(), store, cache, o.output, time.Now())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.output, "output", "o", outputTable, "output format: table or json")
	f.StringVar(&o.volume, "volume", "", "inspect this volume instead of a cache")
	return cmd
}

// validate returns the cache to inspect, or the zero CacheRef with --volume.
func (o *inspectOptions) validate(args []string) (layerfs.CacheRef, error) {
	if err := checkOutput(o.output, outputJSON, outputTable); err != nil {
		return layerfs.CacheRef{}, err
	}
	if o.volume != "" {
		if len(args) > 0 {
			return layerfs.CacheRef{}, fmt.Errorf("give either a cache (%q) or --volume %q, not both", args[0], o.volume)
		}
		return layerfs.CacheRef{}, layerfs.ValidateName("volume", o.volume)
	}
	if len(args) == 0 {
		return layerfs.CacheRef{}, errors.New("missing argument NAMESPACE/NAME; name a cache, or a volume with --volume VOLUME")
	}
	return cacheArg(args)
}

// cacheArg checks the one positional argument NAMESPACE/NAME.
func cacheArg(args []string) (layerfs.CacheRef, error) {
	if err := wantArgs(args, "NAMESPACE/NAME"); err != nil {
		return layerfs.CacheRef{}, err
	}
	return layerfs.ParseCacheRef(args[0])
}

func runInspectCache(ctx context.Context, w io.Writer, store *layerfs.Store, cache layerfs.CacheRef, format string, now time.Time) error {
	info, err := store.Inspect(ctx, cache)
	if err != nil {
		return err
	}
	// Which other caches share a layer is in their heads: read them all.
	all, err := store.List(ctx)
	if err != nil {
		return err
	}
	return writeCacheInfo(w, format, info, all, now)
}

// writeCacheInfo shows info; all are the store's caches, whose heads tell
// which of info's layers are shared with which cache.
func writeCacheInfo(w io.Writer, format string, info layerfs.CacheInfo, all []layerfs.CacheInfo, now time.Time) error {
	heads := layerHeads(all)
	shared := map[string][]layerfs.CacheRef{}
	for _, l := range info.Layers {
		if others := sharedWith(l.ID, info.Cache, heads); len(others) > 0 {
			shared[l.ID] = others
		}
	}
	if format == outputJSON {
		return writeJSON(w, cacheDetails{CacheInfo: info, SharedWith: shared})
	}
	t := newTable(w)
	fmt.Fprintf(t, "Cache:\t%s\n", info.Cache)
	fmt.Fprintf(t, "Generation:\t%d\n", info.Generation)
	if l := layoutName(info.Layout); l != string(layerfs.LayoutOverlay) {
		fmt.Fprintf(t, "Layout:\t%s\n", l) // overlay, the default, goes unsaid
	}
	fmt.Fprintf(t, "Layers:\t%d\n", len(info.Layers))
	if info.SeededFrom != nil {
		fmt.Fprintf(t, "Seeded from:\t%s (its bottom layers may be shared with it)\n", info.SeededFrom)
	}
	fmt.Fprintf(t, "Size:\t%s (%d bytes)\n", v1alpha1.FormatSize(info.Bytes), info.Bytes)
	fmt.Fprintf(t, "Last used:\t%s\n", formatTime(info.LastUsed, now))
	fmt.Fprintf(t, "Last writer:\t%s\n", cmp.Or(info.LastWriter, "-"))
	fmt.Fprintf(t, "Volumes:\t%s\n", cmp.Or(strings.Join(info.Volumes, ", "), "-"))
	if err := t.Flush(); err != nil {
		return err
	}
	if len(info.Layers) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	t = newTable(w)
	// SHARED WITH shows once a layer is shared, as SHARED does in ls.
	header := "LAYER\tSIZE\tFILES\tCREATED\tPUBLISHED"
	if len(shared) > 0 {
		header += "\tSHARED WITH"
	}
	fmt.Fprintln(t, header)
	for _, l := range info.Layers {
		fmt.Fprintf(t, "%s\t%s\t%d\t%s\t%s", l.ID, v1alpha1.FormatSize(l.Bytes), l.Files, formatAge(l.Created, now), published(l))
		if len(shared) > 0 {
			fmt.Fprintf(t, "\t%s", cacheNames(shared[l.ID]))
		}
		fmt.Fprintln(t)
	}
	return t.Flush()
}

// cacheRow is a cache as ls -o json prints it.
type cacheRow struct {
	layerfs.CacheInfo
	// SharedLayers counts the cache's layers that another cache's head
	// also names (a seeded cache and its fallback): the store holds them
	// once.
	SharedLayers int `json:"sharedLayers"`
}

// cacheDetails is a cache as inspect -o json prints it.
type cacheDetails struct {
	layerfs.CacheInfo
	// SharedWith maps each shared layer's id to the other caches whose
	// heads name it.
	SharedWith map[string][]layerfs.CacheRef `json:"sharedWith,omitempty"`
}

// layerHeads maps each layer id to the caches whose heads name it.
func layerHeads(caches []layerfs.CacheInfo) map[string][]layerfs.CacheRef {
	heads := map[string][]layerfs.CacheRef{}
	for _, c := range caches {
		for _, l := range c.Layers {
			heads[l.ID] = append(heads[l.ID], c.Cache)
		}
	}
	return heads
}

// sharedLayers counts c's layers that another cache's head also names.
func sharedLayers(c layerfs.CacheInfo, heads map[string][]layerfs.CacheRef) int {
	n := 0
	for _, l := range c.Layers {
		if len(sharedWith(l.ID, c.Cache, heads)) > 0 {
			n++
		}
	}
	return n
}

// sharedWith is the caches other than self whose heads name layer id.
func sharedWith(id string, self layerfs.CacheRef, heads map[string][]layerfs.CacheRef) []layerfs.CacheRef {
	var others []layerfs.CacheRef
	for _, c := range heads[id] {
		if c != self {
			others = append(others, c)
		}
	}
	return others
}

// cacheNames lists caches comma-separated, "-" for none.
func cacheNames(caches []layerfs.CacheRef) string {
	names := make([]string, len(caches))
	for i, c := range caches {
		names[i] = c.String()
	}
	return cmp.Or(strings.Join(names, ", "), "-")
}

// published says how a layer is in the cache's registry: its digest
// (short, as docker prints image ids), as a squash of published layers,
// or "-" if only this node has it.
func published(l layerfs.LayerInfo) string {
	switch {
	case l.MountFrom != "":
		return "-" // its digest is a fallback's blob, not yet the cache's
	case l.Digest != "":
		return l.Digest[:min(len(l.Digest), len("sha256:")+12)]
	case len(l.Covers) > 0:
		return fmt.Sprintf("squash of %d", len(l.Covers))
	}
	return "-"
}

// volumeDetails is what inspect --volume -o json prints: the volume as ls
// --volumes prints it, plus the mount command.
type volumeDetails struct {
	layerfs.Volume
	MountCommand string `json:"mountCommand"`
}

func runInspectVolume(ctx context.Context, w io.Writer, store *layerfs.Store, volumeID, format string) error {
	vol, err := store.Volume(ctx, volumeID)
	if err != nil {
		return err
	}
	mount, err := store.MountCommand(ctx, volumeID)
	if err != nil {
		return err
	}
	return writeVolumeDetails(w, format, volumeDetails{Volume: *vol, MountCommand: mount})
}

func writeVolumeDetails(w io.Writer, format string, d volumeDetails) error {
	if format == outputJSON {
		return writeJSON(w, d)
	}
	mode := "write"
	if d.ReadOnly {
		mode = "read-only"
	}
	t := newTable(w)
	fmt.Fprintf(t, "Volume:\t%s\n", d.ID)
	fmt.Fprintf(t, "Cache:\t%s\n", d.Cache)
	fmt.Fprintf(t, "Mode:\t%s\n", mode)
	fmt.Fprintf(t, "Writer:\t%s\n", cmp.Or(d.Writer, "-"))
	fmt.Fprintf(t, "Base generation:\t%d\n", d.BaseGeneration)
	if d.SeededFrom != nil {
		fmt.Fprintf(t, "Seeded from:\t%s (its layers are the lower layers; a commit creates the cache on them)\n", d.SeededFrom)
	}
	fmt.Fprintf(t, "Created:\t%s\n", d.Created.UTC().Format(time.RFC3339))
	fmt.Fprintf(t, "Merged path:\t%s\n", d.MergedPath)
	fmt.Fprintf(t, "Mounted:\t%s\n", yesNo(d.Mounted))
	if d.Torn {
		fmt.Fprintf(t, "Torn:\tyes: the node went down while it was mounted; its changes were emptied and it will not be committed\n")
	}
	fmt.Fprintf(t, "Lower layers:\t%d (newest first)\n", len(d.Layers))
	for _, l := range d.Layers {
		fmt.Fprintf(t, "\t%s\n", l)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nMount command:\n  %s\n", d.MountCommand)
	return err
}

func newRmCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAMESPACE/NAME",
		Aliases: []string{"remove"},
		Short:   "Remove a cache and its layers",
		Long: `Remove a cache from the store and print its name. Volumes still using it
keep working; their commits are dropped, and their layers are freed once
they are gone.` + exitStatusHelp,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cache, err := cacheArg(args)
			if err != nil {
				return usage(cmd, err)
			}
			store, err := g.open(cmd.Context(), nil)
			if err != nil {
				return err
			}
			return runRemove(cmd.Context(), cmd.OutOrStdout(), store, cache)
		},
	}
}

func runRemove(ctx context.Context, w io.Writer, store *layerfs.Store, cache layerfs.CacheRef) error {
	if err := store.Remove(ctx, cache); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, cache)
	return err
}

// layoutName is a cache's layout for the table; caches made before
// layouts existed report none and are overlay caches.
func layoutName(l layerfs.Layout) string {
	if l == "" {
		return string(layerfs.LayoutOverlay)
	}
	return string(l)
}

// seedName is a seed as NAMESPACE/NAME@GENERATION, "-" for none.
func seedName(s *layerfs.Seed) string {
	if s == nil {
		return "-"
	}
	return s.String()
}
