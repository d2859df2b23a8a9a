package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

type squashOptions struct {
	maxLayers int
}

func newSquashCommand(g *globalOptions) *cobra.Command {
	o := &squashOptions{}
	cmd := &cobra.Command{
		Use:   "squash NAMESPACE/NAME",
		Short: "Merge a cache's layers into one when it has too many",
		Long: `Merge the layers of a cache into one new layer when it has more than
--max-layers, so that mounts stay fast. The merged view does not change;
volumes already mounted keep using the old layers until they are gone.
Progress is shown on stderr when it is a terminal.` + exitStatusHelp,
		Example: `  layerfs squash ci/maven
  layerfs squash ci/maven --max-layers 1   # squash whatever the depth`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cache, err := cacheArg(args)
			if err != nil {
				return usage(cmd, err)
			}
			if o.maxLayers < 1 {
				return usage(cmd, fmt.Errorf("--max-layers %d: a cache needs at least one layer; use 1 to squash any cache deeper than one layer", o.maxLayers))
			}
			store, finish, err := g.openWithProgress(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return runSquash(cmd.Context(), cmd.OutOrStdout(), store, finish, cache, o.maxLayers)
		},
	}
	cmd.Flags().IntVar(&o.maxLayers, "max-layers", layerfs.DefaultMaxLayers, "squash only when the cache has more layers than this")
	return cmd
}

func runSquash(ctx context.Context, w io.Writer, store *layerfs.Store, finishProgress func(), cache layerfs.CacheRef, maxLayers int) error {
	res, err := store.Squash(ctx, cache, maxLayers)
	finishProgress()
	if err != nil {
		return err
	}
	return writeSquashResult(w, cache, maxLayers, res)
}

func writeSquashResult(w io.Writer, cache layerfs.CacheRef, maxLayers int, res layerfs.SquashResult) error {
	var err error
	if res.Squashed {
		_, err = fmt.Fprintf(w, "squashed %s: %d layers into layer %s (%d entries)\n", cache, res.OldLayers, res.Layer, res.Entries)
	} else {
		// The store leaves OldLayers zero when it did nothing.
		_, err = fmt.Fprintf(w, "nothing to squash: %s has at most %s\n", cache, count(maxLayers, "layer"))
	}
	return err
}

type gcOptions struct {
	maxAge         time.Duration
	maxBytes       quantityValue
	minFree        quantityValue
	minFreePercent float64
}

func newGCCommand(g *globalOptions) *cobra.Command {
	o := &gcOptions{maxAge: 30 * 24 * time.Hour, maxBytes: quantityValue{text: "50Gi", bytes: 50 << 30}, minFree: quantityValue{text: "0"}}
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove old caches, least recently used caches, and unused layers",
		Long: `Remove caches unused for longer than --max-age, then the least recently used
caches while the store is larger than --max-bytes or its filesystem has less
free space than --min-free or --min-free-percent, then layers that no cache
or volume uses. A zero value turns a bound off. Caches in use by a volume are
kept. Progress is shown on stderr when it is a terminal.` + exitStatusHelp,
		Example: `  layerfs gc
  layerfs gc --max-age 168h --max-bytes 100Gi
  layerfs gc --max-age 0 --max-bytes 0   # only unused layers`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := wantArgs(args); err != nil {
				return usage(cmd, err)
			}
			if o.maxAge < 0 {
				return usage(cmd, fmt.Errorf("--max-age %s is negative; use a duration such as 720h, or 0 to keep caches of any age", o.maxAge))
			}
			if o.minFreePercent < 0 || o.minFreePercent >= 100 {
				return usage(cmd, fmt.Errorf("--min-free-percent %v is out of range; use a value from 0 (off) to below 100, such as 10", o.minFreePercent))
			}
			store, finish, err := g.openWithProgress(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return runGC(cmd.Context(), cmd.OutOrStdout(), store, finish, layerfs.GCOptions{
				MaxAge: o.maxAge, MaxBytes: o.maxBytes.bytes, MinFreeBytes: o.minFree.bytes, MinFreePercent: o.minFreePercent,
			})
		},
	}
	cmd.Flags().DurationVar(&o.maxAge, "max-age", o.maxAge, "remove caches unused for longer than this (0: no limit)")
	cmd.Flags().Var(&o.maxBytes, "max-bytes", "remove least recently used caches while the store is larger, in bytes or a quantity like 50Gi or 500M (0: no limit)")
	cmd.Flags().Var(&o.minFree, "min-free", "remove least recently used caches while the store's filesystem has less free space, like 10Gi (0: no limit)")
	cmd.Flags().Float64Var(&o.minFreePercent, "min-free-percent", 0, "remove least recently used caches while the store's filesystem has less free space than this percentage of its size (0: no limit)")
	return cmd
}

func runGC(ctx context.Context, w io.Writer, store *layerfs.Store, finishProgress func(), opts layerfs.GCOptions) error {
	res, err := store.GC(ctx, opts)
	finishProgress()
	if err != nil {
		return err
	}
	return writeGCResult(w, res)
}

func writeGCResult(w io.Writer, res layerfs.GCResult) error {
	if len(res.RemovedCaches) == 0 && res.RemovedLayers == 0 && res.FreedBytes == 0 {
		_, err := fmt.Fprintln(w, "gc: nothing to remove")
		return err
	}
	var removed []string
	if n := len(res.RemovedCaches); n > 0 {
		names := make([]string, n)
		for i, c := range res.RemovedCaches {
			names[i] = c.String()
		}
		removed = append(removed, fmt.Sprintf("%s (%s)", count(n, "cache"), strings.Join(names, ", ")))
	}
	if res.RemovedLayers > 0 {
		removed = append(removed, count(res.RemovedLayers, "layer"))
	}
	_, err := fmt.Fprintf(w, "gc: removed %s, freed %s\n", cmp.Or(strings.Join(removed, " and "), "nothing"), v1alpha1.FormatSize(res.FreedBytes))
	return err
}

// quantityValue is a --max-bytes flag: plain bytes or a Kubernetes quantity
// (50Gi, 500M), as in a Cache's spec.retention.maxSize.
type quantityValue struct {
	text  string
	bytes int64
}

func (q *quantityValue) String() string { return q.text }
func (q *quantityValue) Type() string   { return "quantity" }

func (q *quantityValue) Set(s string) error {
	parsed, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q is not a size; use bytes or a quantity such as 50Gi or 500M", s)
	}
	if parsed.Sign() < 0 {
		return fmt.Errorf("%q is negative; use a size such as 50Gi, or 0 for no limit", s)
	}
	// Value rounds fractions of a byte up, which is what a bound wants.
	q.text, q.bytes = s, parsed.Value()
	return nil
}

func newRecoverCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "recover",
		Short: "Repair the store after a crash or reboot and print what was repaired",
		Long: `Remount volumes whose mounts are gone (after a reboot), finish or roll back
commits and squashes that were interrupted, and remove temporary files and
layers nothing refers to. The node agent does this when it starts; run it by
hand after a crash of the CLI. Safe to run at any time.` + exitStatusHelp,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := wantArgs(args); err != nil {
				return usage(cmd, err)
			}
			store, err := g.open(cmd.Context(), nil)
			if err != nil {
				return err
			}
			return runRecover(cmd.Context(), cmd.OutOrStdout(), store)
		},
	}
}

func runRecover(ctx context.Context, w io.Writer, store *layerfs.Store) error {
	res, err := store.Recover(ctx)
	// Recover repairs what it can past a failing volume: show that too.
	if werr := writeRecoverResult(w, res); werr != nil && err == nil {
		err = werr
	}
	return err
}

func writeRecoverResult(w io.Writer, res layerfs.RecoverResult) error {
	if len(res.Remounted) == 0 && res.RemovedTemp == 0 && res.RemovedLayers == 0 && len(res.Failed) == 0 && len(res.Torn) == 0 && res.Unswept == "" {
		_, err := fmt.Fprintln(w, "recover: nothing to repair")
		return err
	}
	var b strings.Builder
	for _, v := range res.Remounted {
		fmt.Fprintf(&b, "remounted volume %s\n", v)
	}
	if res.RemovedTemp > 0 {
		fmt.Fprintf(&b, "removed %s of interrupted operations\n", count(res.RemovedTemp, "leftover"))
	}
	if res.RemovedLayers > 0 {
		fmt.Fprintf(&b, "removed %s\n", count(res.RemovedLayers, "unreferenced layer"))
	}
	for _, v := range res.Torn {
		fmt.Fprintf(&b, "volume %s was mounted when the node went down: its changes may be torn and were emptied; it will not be committed\n", v)
	}
	for _, f := range res.Failed {
		fmt.Fprintf(&b, "could not repair volume %s: %v\n", f.Volume, f.Err)
	}
	if res.Unswept != "" {
		fmt.Fprintf(&b, "could not delete some unreferenced layers (gc retries them): %s\n", res.Unswept)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
