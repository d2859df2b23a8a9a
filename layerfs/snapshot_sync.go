package layerfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/images"
	"github.com/layercache/layercache/layerfs/tree"
)

// A snapshot cache travels through a registry as overlay caches do, one
// layer per published commit, but each layer is an EROFS image of a whole
// generation (ExportLayer of the generation's subvolume), not a diff. A
// snapshot commit replaces the whole cache (whole-volume last writer
// wins), so the chain's newest layer is the cache, and the chain's order
// is the cross-node order of its writers: a node takes in that layer
// alone. Whole images rather than btrfs send streams, measured and chosen
// for these reasons (see the report of issue 36): a fresh node needs the
// whole tree either way; an image is checked (erofs.Check) before
// anything reads it, as every pulled layer is, while a send stream is a
// list of file-system commands that btrfs receive runs; and an image
// needs no parent on the receiving node, so deletion and squashes of
// older layers never break a later one.

// syncSnapshot makes snapshot cache's head the chain's newest layer, a
// whole generation, unless the head is it already, the chain is older
// than the last one taken in, or the head holds a commit not yet
// published (a later writer than any the chain lists: its publish will
// append it). The generation is built aside (receiveGeneration) under the
// store lock held shared, so the sweep cannot take it, and the head is
// swapped in one write under the cache lock; a crash before leaves a
// subvolume nothing names, which the sweep deletes.
func (s *Store) syncSnapshot(ctx context.Context, cache CacheRef, chain Chain, fetch Fetch, opts SyncOptions) (res SyncResult, err error) {
	if err := s.ensureSnapshotArea(ctx); err != nil {
		return res, fmt.Errorf("sync cache %s: %w", cache, err)
	}
	storeLock, err := s.lockStore(ctx, false)
	if err != nil {
		return res, err
	}
	defer storeLock.Unlock()
	h, err := s.lockedHead(ctx, cache)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return res, fmt.Errorf("sync cache %s: %w", cache, err)
	}
	want, ok := snapshotWants(h, chain)
	if !ok {
		return snapshotResult(h), nil
	}
	if err := s.roomForGeneration(cache, want); err != nil {
		return res, err
	}
	layer, qgroup, err := s.receiveGeneration(ctx, cache, want, fetch, opts)
	if err != nil {
		return res, fmt.Errorf("sync cache %s: pull layer %s: %w", cache, want.Digest, err)
	}
	var old string
	err = s.transact(ctx, scope{cache: cache}, func(t *txn) error {
		old, res = s.swapInGeneration(t, chain, layer, qgroup)
		return nil
	})
	if err != nil || !res.Changed {
		// Not in the head: nothing names it.
		s.snapshots.DeleteGeneration(layer.ID)
		if err != nil {
			return SyncResult{}, fmt.Errorf("sync cache %s: %w", cache, err)
		}
		return res, nil
	}
	// Volumes are snapshots of their own, so the old generation goes now;
	// the sweep deletes it if this fails.
	if old != "" {
		s.snapshots.DeleteGeneration(old)
	}
	return res, nil
}

// snapshotWants is the chain layer a snapshot cache of head h lacks, if
// it should take it in (see syncSnapshot).
func snapshotWants(h *head, chain Chain) (ChainLayer, bool) {
	if len(chain.Layers) == 0 || staleChain(h, chain) {
		return ChainLayer{}, false
	}
	newest := chain.Layers[0]
	if h != nil && len(h.Layers) > 0 && (!h.Layers[0].published() || h.Layers[0].Digest == newest.Digest) {
		return ChainLayer{}, false
	}
	return newest, true
}

// snapshotResult is the result of a Sync that left head h as it was.
func snapshotResult(h *head) SyncResult {
	if h == nil {
		return SyncResult{}
	}
	return SyncResult{Generation: h.Generation, Unpublished: countUnpublished(h.Layers)}
}

// swapInGeneration makes the received layer t's head, if the head still
// lacks it (a commit or another sync may have landed meanwhile). old is
// the generation it replaced.
func (s *Store) swapInGeneration(t *txn, chain Chain, layer LayerInfo, qgroup uint64) (old string, res SyncResult) {
	h := t.Head
	want, ok := snapshotWants(h, chain)
	if !ok || want.Digest != layer.Digest {
		return "", snapshotResult(h)
	}
	now := time.Now().UTC()
	if h == nil {
		h = &head{Cache: t.cache, UID: randomID(), Created: now, Layout: LayoutSnapshot}
	}
	if len(h.Layers) > 0 {
		old = h.Layers[0].ID
	}
	h.Layers = []LayerInfo{layer}
	h.Qgroups = s.snapshots.Lineage(nil, qgroup)
	h.Generation = max(h.Generation, chain.Generation)
	h.ChainGeneration, h.LastUsed = chain.Generation, now
	t.Head = h
	return old, SyncResult{Changed: true, Fetched: 1, FetchedBytes: layer.Bytes, Generation: h.Generation}
}

// receiveGeneration fetches the image of a published generation, checks
// it as every pulled layer is (images.Pull), mounts it in a temp dir and
// copies its tree into a new generation. The image goes once the copy is
// made; Recover unmounts and removes what a crash leaves in tmp/.
func (s *Store) receiveGeneration(ctx context.Context, cache CacheRef, cl ChainLayer, fetch Fetch, opts SyncOptions) (layer LayerInfo, qgroup uint64, err error) {
	cl, err = admitLayer(cl, opts.MaxLayerBytes)
	if err != nil {
		return layer, 0, err
	}
	work, err := os.MkdirTemp(s.tmpDir(), "snapshot-pull-")
	if err != nil {
		return layer, 0, err
	}
	defer func() {
		if cerr := unmountAll(work); cerr != nil && err == nil {
			err = fmt.Errorf("unmount the image: %w", cerr)
		}
		os.RemoveAll(work)
	}()
	dirs := images.Dirs{Images: filepath.Join(work, "image"), Layers: filepath.Join(work, "tree")}
	for _, d := range []string{dirs.Images, dirs.Layers} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return layer, 0, err
		}
	}
	const img = "generation"
	open := func(ctx context.Context) (io.ReadCloser, error) { return fetch(ctx, cl) }
	pulled, err := dirs.Pull(ctx, img, work, cl.Digest, open, opts.MaxLayerBytes)
	if err != nil {
		return layer, 0, err
	}
	gen := randomID()
	rec, err := s.snapshots.Receive("pull-"+gen, gen, func(dir string) error {
		return tree.CopyContext(ctx, filepath.Join(dirs.Layers, img), dir, nil)
	})
	if err != nil {
		s.snapshots.DeleteGeneration(gen)
		return layer, 0, err
	}
	return LayerInfo{ID: gen, Bytes: rec.Bytes, Files: pulled.Files, Created: time.Now().UTC(), Digest: cl.Digest}, rec.Subvol, nil
}

// roomForGeneration checks, before the first byte is fetched, that the
// image fits in the store's tmp/ and its tree in the btrfs area (each at
// most the blob's size, which is the image's): a generation too large for
// the node fails at once, not after filling the disk its builds use.
func (s *Store) roomForGeneration(cache CacheRef, cl ChainLayer) error {
	for _, dir := range []string{s.root, s.snapshots.Dir()} {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return fmt.Errorf("sync cache %s: measure free space of %s: %w", cache, dir, err)
		}
		if free := int64(st.Bavail) * st.Bsize; cl.Size > free {
			return fmt.Errorf("sync cache %s: its generation's image takes %d bytes, but %s has %d free (GC frees unused caches; or give the store more room): %w",
				cache, cl.Size, dir, free, ErrNoSpace)
		}
	}
	return nil
}
