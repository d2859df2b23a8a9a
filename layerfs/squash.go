package layerfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/overlay"
	"github.com/layercache/layercache/layerfs/tree"
)

// Squash merges a cache's layers into one when the head is deeper than
// maxLayers (Options.MaxLayers if 0). In a cache synced through a registry
// it merges the bottom run of published layers, and the new layer's
// Covers lists their digests, so that it still counts as published; the
// unpublished layers above stay as they are (see squashRun). The merge copies the kernel's own
// read-only overlay view of the chain, so whiteouts and opaque directories
// are honoured exactly as mounts see them. It runs without the cache lock;
// commits that land meanwhile stay on top. Old layers are removed once no
// volume uses them.
func (s *Store) Squash(ctx context.Context, cache CacheRef, maxLayers int) (SquashResult, error) {
	if err := cache.Validate(); err != nil {
		return SquashResult{}, err
	}
	if maxLayers <= 0 {
		maxLayers = s.opts.MaxLayers
	}
	res, err := s.squash(ctx, cache, maxLayers)
	if err != nil || !res.Squashed {
		return res, err
	}
	if _, err := s.sweepLayers(ctx); err != nil {
		return res, fmt.Errorf("squashed cache %s, but removing its old layers failed (gc retries): %w", cache, err)
	}
	return res, nil
}

func (s *Store) squash(ctx context.Context, cache CacheRef, maxLayers int) (res SquashResult, err error) {
	storeLock, err := s.lockStore(ctx, false)
	if err != nil {
		return res, err
	}
	defer storeLock.Unlock()
	if err := s.endLandedVolumes(ctx, cache); err != nil {
		return res, fmt.Errorf("squash cache %s: %w", cache, err)
	}
	h, err := s.lockedHead(ctx, cache)
	if err != nil {
		return res, fmt.Errorf("squash cache %s: %w", cache, err)
	}
	if len(h.Layers) <= maxLayers || !s.layoutOf(h.Layout).squashes() {
		return res, nil
	}
	old := h.Layers[len(h.Layers)-squashRun(h.Layers):]
	if len(old) < 2 {
		return res, nil
	}
	ids := make([]string, len(old))
	for i, l := range old {
		ids[i] = l.ID
	}
	layer, err := s.mergeLayers(ctx, cache, ids)
	if err != nil {
		return res, err
	}
	layer.Covers = covers(old)
	defer func() {
		if err != nil {
			os.RemoveAll(s.layerDir(layer.ID))
		}
	}()
	if err = s.swapInSquashed(ctx, h, old, layer); err != nil {
		return res, err
	}
	return SquashResult{Squashed: true, Layer: layer.ID, OldLayers: len(old), Entries: layer.Files}, nil
}

// squashRun is how many of the head's bottom layers a squash may merge:
// the longest bottom run of layers that are all published or all
// unpublished. A merge must start at the bottom (a read-only view of
// upper layers alone would drop their whiteouts), and a layer mixing
// published and unpublished content could be neither skipped by a push
// nor stacked on a newer chain without shadowing it.
func squashRun(layers []LayerInfo) int {
	n := len(layers)
	if n == 0 {
		return 0
	}
	i := n - 1
	for i > 0 && layers[i-1].published() == layers[n-1].published() {
		i--
	}
	return n - i
}

// covers is the chain run that published layers stand for, newest first;
// none when a layer of the run is not published. A squash that merged an
// unpublished commit must be pushed as a layer of its own: standing for
// the digests of the rest (a seeded cache's fallback blobs, MountFrom) it
// would count as published, and that commit would never leave the node.
func covers(layers []LayerInfo) []string {
	var ds []string
	for _, l := range layers {
		if !l.published() {
			return nil
		}
		if l.Digest != "" {
			ds = append(ds, l.Digest)
		} else {
			ds = append(ds, l.Covers...)
		}
	}
	return ds
}

// mergeLayers builds one new layer equal to the merged view of ids.
func (s *Store) mergeLayers(ctx context.Context, cache CacheRef, ids []string) (layer LayerInfo, err error) {
	work, err := os.MkdirTemp(s.tmpDir(), "squash-")
	if err != nil {
		return layer, fmt.Errorf("squash %s: %w", cache, err)
	}
	defer os.RemoveAll(work)
	view := filepath.Join(work, "view")
	if err := os.Mkdir(view, 0o700); err != nil {
		return layer, err
	}
	if err := s.readyLayers(ids); err != nil {
		return layer, fmt.Errorf("squash %s: %w", cache, err)
	}
	if err := (overlay.Spec{Lower: s.lowerDirs(ids)}).Mount(view); err != nil {
		return layer, fmt.Errorf("squash %s: mount its layers read-only: %w", cache, err)
	}
	defer ondisk.Unmount(view)

	tmp, err := os.MkdirTemp(s.layersDir(), "new-")
	if err != nil {
		return layer, fmt.Errorf("squash %s: %w", cache, err)
	}
	defer func() {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
	}()
	report := func(done int64) {
		s.progress(Progress{Op: "squash", Cache: cache.String(), Done: done})
	}
	if err := tree.Copy(view, tmp, report); err != nil {
		return layer, fmt.Errorf("squash %s: copy merged view: %w", cache, err)
	}
	if err := ctx.Err(); err != nil {
		return layer, err
	}
	if err := ondisk.SyncFS(tmp); err != nil {
		return layer, fmt.Errorf("squash %s: %w", cache, err)
	}
	bytes, files, err := tree.DiskUsage(tmp)
	if err != nil {
		return layer, fmt.Errorf("squash %s: %w", cache, err)
	}
	layer = LayerInfo{ID: randomID(), Bytes: bytes, Files: files, Created: time.Now().UTC()}
	if err := ondisk.RenameDurable(tmp, s.layerDir(layer.ID)); err != nil {
		return layer, fmt.Errorf("squash %s: %w", cache, err)
	}
	tmp = ""
	return layer, nil
}

// swapInSquashed replaces the squashed layers in the current head. Commits
// that landed since are newer and stay on top; if the cache was removed or
// rewritten meanwhile, the squash is abandoned.
func (s *Store) swapInSquashed(ctx context.Context, before *head, old []LayerInfo, layer LayerInfo) error {
	return s.transact(ctx, scope{cache: before.Cache}, func(t *txn) error {
		h := t.Head
		if h == nil {
			return fmt.Errorf("squash %s: %w", before.Cache, ErrNotFound)
		}
		n := len(h.Layers) - len(old)
		if h.UID != before.UID || n < 0 || !slices.EqualFunc(h.Layers[n:], old, func(a, b LayerInfo) bool { return a.ID == b.ID }) {
			return fmt.Errorf("squash %s: the cache changed underneath (removed or squashed by another process); nothing was changed", before.Cache)
		}
		h.Layers = append(slices.Clone(h.Layers[:n]), layer)
		return nil
	})
}
