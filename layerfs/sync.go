package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// defaultSyncParallel is how many layers a Sync fetches at once.
const defaultSyncParallel = 4

// maxSyncRounds bounds how often Sync fetches again because the head
// changed while it fetched (a squash or another sync took layers away).
const maxSyncRounds = 3

// Sync makes cache's head the chain, with the node's unpublished layers (no
// Digest) stacked on top in their current order. Layers of the chain the
// head lacks (by Digest) are fetched in parallel, each streamed into a new
// temp dir under tmp/ with OCI whiteouts converted to overlay whiteouts,
// fsynced, and renamed into layers/; the head is swapped atomically under
// the cache lock only once all are present, so a crash never leaves a
// half-updated head (temp dirs are removed by Recover, complete but
// unreferenced layers by GC). Holds the store lock shared throughout so GC
// cannot sweep a fetched layer before the head references it. Local
// layers with a digest that the chain no longer has leave the head
// (volumes that use them keep them). Generation after sync = max(old
// generation, chain.Generation + unpublished count). Creates the cache if
// it does not exist. A second Sync with the same chain changes nothing.
// Reports progress through Options.Progress (Op "pull").
//
// A local layer whose Covers equals a contiguous run of the chain (a
// squash of published layers) stands for that run: nothing is fetched.
// A chain with a lower Generation than the last one synced (a stale read)
// changes nothing.
func (s *Store) Sync(ctx context.Context, cache CacheRef, chain Chain, fetch Fetch, opts SyncOptions) (SyncResult, error) {
	if err := validateSync(cache, chain, opts); err != nil {
		return SyncResult{}, err
	}
	if opts.Parallel == 0 {
		opts.Parallel = defaultSyncParallel
	}
	layout, err := s.syncLayout(cache, opts.Layout)
	if err != nil {
		return SyncResult{}, err
	}
	if layout == LayoutSnapshot {
		return s.syncSnapshot(ctx, cache, chain, fetch, opts)
	}
	res, err := s.sync(ctx, cache, chain, fetch, opts)
	if err != nil || !res.Changed {
		return res, err
	}
	// A build waits for this Sync: the layers it dropped are removed only
	// if no other operation holds the store (a long pull of another
	// cache); otherwise the next sweep or GC removes them.
	now, cancel := context.WithCancel(ctx)
	cancel()
	s.sweepLayers(now)
	return res, nil
}

// syncLayout is the layout a Sync keeps cache in: its own, or want
// ("" is overlay) for a cache not made yet.
func (s *Store) syncLayout(cache CacheRef, want Layout) (Layout, error) {
	h, err := s.readHead(cache)
	switch {
	case errors.Is(err, ErrNotFound):
		return want.orDefault(), nil
	case err != nil:
		return "", fmt.Errorf("sync cache %s: %w", cache, err)
	case want != "":
		if err := checkLayout(cache, h.Layout, want); err != nil {
			return "", fmt.Errorf("sync cache %s: %w", cache, err)
		}
	}
	return h.Layout.orDefault(), nil
}

func validateSync(cache CacheRef, chain Chain, opts SyncOptions) error {
	if err := cache.Validate(); err != nil {
		return err
	}
	if opts.Parallel < 0 {
		return fmt.Errorf("sync parallelism %d is negative: use a positive number, or 0 for %d", opts.Parallel, defaultSyncParallel)
	}
	if chain.Generation < 0 {
		return fmt.Errorf("chain generation %d of cache %s is negative", chain.Generation, cache)
	}
	seen := map[string]int{}
	for i, l := range chain.Layers {
		if err := validateDigest(fmt.Sprintf("layer %d of the chain of cache %s", i, cache), l.Digest); err != nil {
			return err
		}
		// A chain that lists a blob twice would fetch and store it twice:
		// no chain the agents write does.
		if j, ok := seen[l.Digest]; ok {
			return fmt.Errorf("layer %d of the chain of cache %s repeats the digest %s of layer %d: a chain names each blob once", i, cache, l.Digest, j)
		}
		seen[l.Digest] = i
	}
	return nil
}

// roomFor checks, before the first byte is fetched, that the layers of
// the chain a sync lacks fit in the free space of the store's filesystem
// (the blob's size is the layer's on disk), so that a chain too large for
// the node fails at once instead of filling the disk every other cache
// and build on the node writes to.
func (s *Store) roomFor(cache CacheRef, chain Chain, missing []int) error {
	var need int64
	for _, i := range missing {
		need += chain.Layers[i].Size
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.root, &st); err != nil {
		return fmt.Errorf("sync cache %s: measure free space of %s: %w", cache, s.root, err)
	}
	if free := int64(st.Bavail) * st.Bsize; need > free {
		return fmt.Errorf("sync cache %s: the %d layers this node lacks take %d bytes, but the store's filesystem has %d free (GC frees unused caches; or give the store more room): %w",
			cache, len(missing), need, free, ErrNoSpace)
	}
	return nil
}

func (s *Store) sync(ctx context.Context, cache CacheRef, chain Chain, fetch Fetch, opts SyncOptions) (res SyncResult, err error) {
	storeLock, err := s.lockStore(ctx, false)
	if err != nil {
		return res, err
	}
	defer storeLock.Unlock()
	// A sync may take layers out of the head, as a squash does.
	if err := s.endLandedVolumes(ctx, cache); err != nil {
		return res, fmt.Errorf("sync cache %s: %w", cache, err)
	}
	fetched := map[int]LayerInfo{} // chain index -> layer fetched for it
	var kept []string              // the new head's layers
	defer func() {
		// Fetched layers the head did not take (or all, on failure) are
		// unreferenced; the store lock keeps anyone else from using them.
		for _, l := range fetched {
			if err != nil || !slices.Contains(kept, l.ID) {
				os.RemoveAll(s.layerDir(l.ID))
			}
		}
	}()
	for range maxSyncRounds {
		h, herr := s.lockedHead(ctx, cache)
		if herr != nil && !errors.Is(herr, ErrNotFound) {
			return res, fmt.Errorf("sync cache %s: %w", cache, herr)
		}
		var local []LayerInfo
		if h != nil {
			local = h.Layers
		}
		if p := planSync(local, chain.Layers, fetched); len(p.missing) > 0 && !staleChain(h, chain) {
			if err := s.roomFor(cache, chain, p.missing); err != nil {
				return res, err
			}
			if err := s.fetchLayers(ctx, cache, chain, p.missing, fetch, opts, fetched); err != nil {
				return res, err
			}
		}
		var done bool
		done, kept, err = s.swapInSynced(ctx, cache, chain, fetched, &res)
		if err != nil || done {
			return res, err
		}
	}
	return res, fmt.Errorf("sync cache %s: its head kept changing while layers were fetched; try again", cache)
}

// syncPlan is the head a Sync aims at, and what it lacks.
type syncPlan struct {
	layers      []LayerInfo // the new head, newest first
	missing     []int       // chain indexes no local or fetched layer stands for
	unpublished int
}

// planSync lays the chain out of local layers (by Digest, or a squash by
// Covers, the longest run first) and fetched ones, under the local
// unpublished layers. Each local layer is used once: overlay stacks a
// directory only once.
func planSync(local []LayerInfo, chain []ChainLayer, fetched map[int]LayerInfo) syncPlan {
	var p syncPlan
	used := map[string]bool{}
	for _, l := range local {
		if !l.published() {
			p.layers = append(p.layers, l)
			used[l.ID] = true
			p.unpublished++
		}
	}
	for i := 0; i < len(chain); {
		l, n := standsFor(local, used, chain[i:])
		switch {
		case n > 0:
			p.layers = append(p.layers, l)
			used[l.ID] = true
			i += n
			continue
		case len(chain[i].Covers) > 0 && p.addRun(local, used, chain[i].Covers):
		case fetched[i].ID != "":
			p.layers = append(p.layers, fetched[i])
		default:
			p.missing = append(p.missing, i)
		}
		i++
	}
	return p
}

// addRun adds the local layers that stand for a published squash's
// covered digests, if local layers stand for all of them.
func (p *syncPlan) addRun(local []LayerInfo, used map[string]bool, covers []string) bool {
	run := make([]ChainLayer, len(covers))
	for i, d := range covers {
		run[i] = ChainLayer{Digest: d}
	}
	var layers []LayerInfo
	for i := 0; i < len(run); {
		l, n := standsFor(local, used, run[i:])
		if n == 0 {
			for _, l := range layers {
				delete(used, l.ID)
			}
			return false
		}
		layers = append(layers, l)
		used[l.ID] = true
		i += n
	}
	p.layers = append(p.layers, layers...)
	return true
}

// standsFor finds the unused local layer that stands for the longest run
// at the start of chain: itself by Digest, or the layers its Covers lists.
func standsFor(local []LayerInfo, used map[string]bool, chain []ChainLayer) (LayerInfo, int) {
	var best LayerInfo
	n := 0
	for _, l := range local {
		if used[l.ID] || !l.published() {
			continue
		}
		if l.Digest == chain[0].Digest && n < 1 {
			best, n = l, 1
		}
		if len(l.Covers) > n && coversPrefix(l.Covers, chain) {
			best, n = l, len(l.Covers)
		}
	}
	return best, n
}

func coversPrefix(covers []string, chain []ChainLayer) bool {
	if len(covers) > len(chain) {
		return false
	}
	for i, d := range covers {
		if chain[i].Digest != d {
			return false
		}
	}
	return true
}

// swapInSynced plans again under the cache lock and, if nothing is
// missing, writes the new head. done is false when the head changed so
// that more layers must be fetched; kept lists the head's layers.
func (s *Store) swapInSynced(ctx context.Context, cache CacheRef, chain Chain, fetched map[int]LayerInfo, res *SyncResult) (done bool, kept []string, err error) {
	err = s.transact(ctx, scope{cache: cache}, func(t *txn) error {
		done, kept = s.planSwap(t, chain, fetched, res)
		return nil
	})
	if err != nil {
		return false, nil, fmt.Errorf("sync cache %s: %w", cache, err)
	}
	return done, kept, nil
}

// planSwap changes the transaction's head to the synced one, if nothing
// is missing for it.
func (s *Store) planSwap(t *txn, chain Chain, fetched map[int]LayerInfo, res *SyncResult) (done bool, kept []string) {
	now := time.Now().UTC()
	created := t.Head == nil
	h := t.Head
	if created {
		h = &head{Cache: t.cache, UID: randomID(), Created: now}
	}
	p := planSync(h.Layers, chain.Layers, fetched)
	if staleChain(h, chain) {
		*res = SyncResult{Generation: h.Generation, Unpublished: countUnpublished(h.Layers), NeedsSquash: len(h.Layers) > s.opts.MaxLayers}
		return true, h.layerIDs()
	}
	if len(p.missing) > 0 {
		return false, nil
	}
	gen := max(h.Generation, chain.Generation+int64(p.unpublished))
	*res = SyncResult{Generation: gen, Unpublished: p.unpublished, NeedsSquash: len(p.layers) > s.opts.MaxLayers}
	for _, fl := range fetched {
		if slices.ContainsFunc(p.layers, func(x LayerInfo) bool { return x.ID == fl.ID }) {
			res.Fetched++
			res.FetchedBytes += fl.Bytes
		}
	}
	if !created && gen == h.Generation && chain.Generation == h.ChainGeneration && slices.EqualFunc(p.layers, h.Layers, sameLayer) {
		return true, h.layerIDs()
	}
	ondisk.FaultPoint()
	h.Layers, h.Generation, h.ChainGeneration, h.LastUsed = p.layers, gen, chain.Generation, now
	t.Head = h
	res.Changed = true
	return true, h.layerIDs()
}

// staleChain tells a chain older than the last one synced: an agent's
// stale read of the Cache resource. Applying it would drop layers the
// cache has since gained, only to fetch them again.
func staleChain(h *head, chain Chain) bool {
	return h != nil && chain.Generation < h.ChainGeneration
}

func countUnpublished(layers []LayerInfo) int {
	n := 0
	for _, l := range layers {
		if !l.published() {
			n++
		}
	}
	return n
}

func sameLayer(a, b LayerInfo) bool {
	return a.ID == b.ID && a.Digest == b.Digest && a.MountFrom == b.MountFrom && slices.Equal(a.Covers, b.Covers)
}

// fetchLayers fetches the chain layers at indexes missing, opts.Parallel
// at a time, into fetched, reporting each as it lands. On failure the
// layers fetched so far stay in fetched for the caller to remove.
func (s *Store) fetchLayers(ctx context.Context, cache CacheRef, chain Chain, missing []int, fetch Fetch, opts SyncOptions, fetched map[int]LayerInfo) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Parallel)
	var mu sync.Mutex // guards fetched, done and the progress calls
	done := 0
	for _, i := range missing {
		g.Go(func() error {
			d := chain.Layers[i].Digest
			l, err := s.pullLayer(gctx, cache, chain.Layers[i], fetch, opts)
			if err != nil {
				return fmt.Errorf("sync cache %s: pull layer %s: %w", cache, d, err)
			}
			mu.Lock()
			defer mu.Unlock()
			fetched[i] = l
			done++
			s.progress(Progress{Op: "pull", Cache: cache.String(), Done: int64(done), Total: int64(len(missing))})
			return nil
		})
	}
	return g.Wait()
}

// pullLayer brings one chain layer into the store under a new id, within
// opts.MaxLayerBytes (0: no bound), or mounts it lazily (opts.OpenLazy): a layer whose chain states a larger blob is not
// fetched at all, and the fetch stops at the size the chain states.
func (s *Store) pullLayer(ctx context.Context, cache CacheRef, cl ChainLayer, fetch Fetch, opts SyncOptions) (LayerInfo, error) {
	cl, err := admitLayer(cl, opts.MaxLayerBytes)
	if err != nil {
		return LayerInfo{}, err
	}
	if opts.OpenLazy != nil && cl.Lazy() {
		return s.pullLazy(ctx, cache, cl, opts)
	}
	return s.pullImage(ctx, cl, fetch, opts.MaxLayerBytes)
}

// admitLayer refuses a chain layer before any of it is fetched: one
// whose blob is over maxBytes (0: no bound), or of a format the node
// does not take in. A layer without a stated size is read no further
// than maxBytes.
func admitLayer(cl ChainLayer, maxBytes int64) (ChainLayer, error) {
	if maxBytes > 0 {
		if cl.Size > maxBytes {
			return cl, fmt.Errorf("its blob is %d bytes, over the bound of %d: %w", cl.Size, maxBytes, ErrTooLarge)
		}
		if cl.Size <= 0 {
			cl.Size = maxBytes
		}
	}
	if cl.Format != FormatEROFS {
		// Layers were once published as OCI tars; nothing released did,
		// and a tar is unpacked, not checked, so none is taken in.
		return cl, fmt.Errorf("layer %s is of format %q; a node takes in %q images only: %w", cl.Digest, cl.Format, FormatEROFS, ErrInvalidImage)
	}
	return cl, nil
}
