package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/remote"
)

// Event reasons of registry sync.
const (
	reasonSyncIncomplete     = "SyncIncomplete"
	reasonRegistryFailed     = "RegistryFailed"
	reasonPublished          = "Published"
	reasonLayerTooLarge      = "LayerTooLarge"
	reasonLayerUnpublishable = "LayerUnpublishable"
)

// Reasons of the failures metric that are not an Event reason.
const (
	failureTooLarge      = "too-large"
	failureUnpublishable = "unpublishable"
)

// errPublishBlocked is a publish skipped because its oldest pending layer
// cannot be published and nothing changed since that was reported.
var errPublishBlocked = errors.New("the oldest unpublished layer cannot be published; waiting for a commit or squash")

// Keys of a registry Secret: .dockerconfigjson as in image pull secrets,
// and an optional CA bundle.
const (
	secretKeyCA = "ca.crt"
)

// secretGetter reads a Secret of the node agents' namespace.
type secretGetter func(ctx context.Context, name string) (*corev1.Secret, error)

// syncer keeps a node's caches in step with their registries. The Cache
// resource's status.published is the cluster-wide chain; the registry
// holds the layers. After a commit the node pushes its new layers and
// appends them to the chain (publish); before a mount it fetches the
// layers of the chain it lacks (pull).
type syncer struct {
	node    string
	store   store
	caches  *caches
	secrets secretGetter
	events  events.EventRecorder
	metrics *metrics
	// trust checks every chain read against the classes the agent
	// serves.
	trust       *trust
	tmpDir      string
	compression remote.Compression
	reports     *cacheQueue
	squashes    *cacheQueue
	// publishes runs publish off the critical path; nil in tests that
	// call publish themselves.
	publishes *cacheQueue
	// locks serialize a cache's head changes (a pull's Sync, a publish's
	// chain append and digest record), so neither sees the other half done.
	locks keyedLocks
	// failing has each failing cache's last publish failure, so that an
	// outage makes one Event, not one per retry, and status shows it.
	// stuck has the caches whose oldest pending layer cannot be
	// published, keyed to the pending layers it was found with.
	mu      sync.Mutex
	failing map[layerfs.CacheRef]string
	stuck   map[layerfs.CacheRef]string
	// inFlight has the volumes announced and not yet committed.
	inFlight map[string]bool
}

// queuePublish queues a publish of the cache; a nil syncer (tests) or
// queue does nothing.
func (s *syncer) queuePublish(ref layerfs.CacheRef) {
	if s != nil {
		s.publishes.Add(ref)
	}
}

// prepare records the registry of a cache's owner on its Cache, so that
// every node and a restarted agent know where the cache syncs to. Only a
// writing claim of the cache's own namespace does: the owner decides
// where its cache goes, and a reader's class never does (it pulls what
// the owner published, or mounts what its node has). The first registry
// wins once a layer is published, as a cache's chain lives in one
// repository; a chain without layers that names another is replaced, as
// nothing lives there (a reader's class named it before readers were
// kept from writing it).
func (s *syncer) prepare(ctx context.Context, claimNamespace string, req volumeRequest) error {
	if claimNamespace != req.Cache.Namespace || req.Mode != v1alpha1.ModeWrite {
		return nil
	}
	reg := req.Registry
	_, err := s.caches.updatePublished(ctx, req.Cache, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if pub != nil && (len(pub.Layers) > 0 || pub.Repository == reg.Repository && pub.Secret == reg.Secret) {
			return pub, false
		}
		return &v1alpha1.PublishedChain{Repository: reg.Repository, Secret: reg.Secret}, true
	})
	return err
}

// pull brings the node's copy of the cache up to its published chain
// before a volume mounts it, within the class's sync timeout and the
// claim's layer bound. It never fails the claim: past the timeout, or
// when the registry fails, a layer is too large or the chain is not
// trusted, the volume mounts what the node has, and an Event on the claim
// says so.
func (s *syncer) pull(ctx context.Context, claim *corev1.PersistentVolumeClaim, req volumeRequest) {
	ref, reg := req.Cache, req.Registry
	logger := log.FromContext(ctx).WithValues("cache", ref.String())
	ctx, cancel := context.WithTimeout(ctx, reg.SyncTimeout)
	defer cancel()
	start := time.Now()
	var res layerfs.SyncResult
	var cache *v1alpha1.Cache
	err := s.prepare(ctx, claim.Namespace, req)
	if err == nil {
		res, cache, err = s.syncTo(ctx, ref, reg)
	}
	if err == nil {
		res, cache, err = s.catchUp(ctx, claim, req, cache, res)
	}
	if err != nil {
		s.pullFailed(ctx, claim, req, cache, err)
		return
	}
	if res.Fetched > 0 {
		s.metrics.registryLayers.WithLabelValues("pull").Add(float64(res.Fetched))
		s.metrics.registryBytes.WithLabelValues("pull").Add(float64(res.FetchedBytes))
		s.metrics.registrySeconds.WithLabelValues("pull").Observe(time.Since(start).Seconds())
		logger.Info("Pulled", "registry", cache.Status.Published.Repository, "layers", res.Fetched, "bytes", res.FetchedBytes,
			"generation", res.Generation, "seconds", time.Since(start).Seconds())
	}
}

// catchUp waits for the layers other nodes announced (see announce.go)
// and takes them in, leaving part of the sync timeout for the pull of
// what arrives. An announced layer that does not arrive in time is a
// SyncIncomplete Event that names it; the volume mounts without it.
func (s *syncer) catchUp(ctx context.Context, claim *corev1.PersistentVolumeClaim, req volumeRequest, cache *v1alpha1.Cache, res layerfs.SyncResult) (layerfs.SyncResult, *v1alpha1.Cache, error) {
	waitCtx, cancel := context.WithTimeout(ctx, req.Registry.SyncTimeout*3/4)
	latest, missing := s.awaitAnnounced(waitCtx, cache)
	cancel()
	if len(missing) > 0 {
		s.events.Eventf(claim, nil, corev1.EventTypeWarning, reasonSyncIncomplete, actionPull,
			"node %s mounts cache %s without the announced %s; later builds get it once it is published (%s: %s)",
			s.node, req.Cache, missing, paramSyncTimeout, req.Registry.SyncTimeout)
		log.FromContext(ctx).Info("Announced layers did not arrive; mounting without them", "cache", req.Cache.String(), "missing", missing.String())
	}
	if latest == cache || latest.Status.Published.Generation == cache.Status.Published.Generation {
		return res, cache, nil
	}
	more, latest, err := s.syncTo(ctx, req.Cache, req.Registry)
	more.Changed = more.Changed || res.Changed
	more.Fetched += res.Fetched
	more.FetchedBytes += res.FetchedBytes
	return more, latest, err
}

// pullFailed reports a pull that failed; the volume mounts what the node
// has. cache is the Cache as the pull read it, if it did.
func (s *syncer) pullFailed(ctx context.Context, claim *corev1.PersistentVolumeClaim, req volumeRequest, cache *v1alpha1.Cache, err error) {
	ref, reg := req.Cache, req.Registry
	logger := log.FromContext(ctx).WithValues("cache", ref.String())
	where := "the cache's registry"
	if cache != nil && cache.Status.Published != nil {
		where = cache.Status.Published.Repository
	}
	var untrusted *untrustedError
	switch {
	case errors.As(err, &untrusted):
		s.metrics.fail(opPull, failureUntrusted)
		msg := fmt.Sprintf("node %s fetched nothing for cache %s and the volume mounts what the node has: %v", s.node, ref, err)
		s.events.Eventf(claim, nil, corev1.EventTypeWarning, reasonUntrustedChain, actionPull, "%s", msg)
		if cache != nil {
			s.events.Eventf(cache, nil, corev1.EventTypeWarning, reasonUntrustedChain, actionPull,
				"node %s refused to pull for claim %s/%s: %v; fix status.published or the StorageClasses", s.node, claim.Namespace, claim.Name, err)
		}
		logger.Info("Published chain refused; mounting what the node has", "err", err.Error())
	case errors.Is(err, layerfs.ErrTooLarge):
		s.metrics.fail(opPull, failureTooLarge)
		s.events.Eventf(claim, nil, corev1.EventTypeWarning, reasonLayerTooLarge, actionPull, "%s", tooLargeMessage(ref, s.node, reg, cache, err))
		logger.Info("Layer too large; mounting what the node has", "err", err.Error())
	case ctx.Err() != nil:
		s.metrics.fail(opPull, "timeout")
		s.events.Eventf(claim, nil, corev1.EventTypeWarning, reasonSyncIncomplete, actionPull,
			"the layers of cache %s that node %s lacks did not arrive from %s within the StorageClass's %s of %s, so the volume mounts what the node has (a colder cache); raise %s if builds wait for it gladly: %v",
			ref, s.node, where, paramSyncTimeout, reg.SyncTimeout, paramSyncTimeout, err)
		logger.Info("Pull incomplete; mounting what the node has", "err", err.Error())
	default:
		s.metrics.fail(opPull, failureReason(err))
		s.events.Eventf(claim, nil, corev1.EventTypeWarning, reasonRegistryFailed, actionPull,
			"could not bring cache %s up to date from %s, so the volume mounts what node %s has: %v", ref, where, s.node, err)
		logger.Error(err, "Pull failed; mounting what the node has")
	}
}

// tooLargeMessage tells which layer passed which bound, and how to lift
// it.
func tooLargeMessage(ref layerfs.CacheRef, node string, bounds *registryRef, cache *v1alpha1.Cache, err error) string {
	what := "a layer"
	if cache != nil && cache.Status.Published != nil {
		for _, l := range cache.Status.Published.Layers {
			if bounds.MaxLayerBytes > 0 && l.Size > bounds.MaxLayerBytes {
				what = fmt.Sprintf("layer %s (%s)", l.Digest, v1alpha1.FormatSize(l.Size))
				break
			}
		}
	}
	fix := fmt.Sprintf("raise parameter %s of StorageClass %q", paramMaxLayerSize, bounds.Class)
	if bounds.BoundFrom == boundFromClaim {
		fix = fmt.Sprintf("raise the claim's storage request, or set parameter %s on StorageClass %q", paramMaxLayerSize, bounds.Class)
	}
	return fmt.Sprintf("%s of cache %s is larger than the bound of %s (%s), so node %s did not keep it and the volume mounts what the node has; %s: %v",
		what, ref, v1alpha1.FormatSize(bounds.MaxLayerBytes), bounds.BoundFrom, node, fix, err)
}

// syncTo makes the node's head the Cache's published chain, under the
// cache's lock, within the bounds of bounds. The chain is read under the
// lock: one read before it could predate a layer this node appended
// meanwhile, and a Sync to it would drop that layer from the head. It is
// checked there too, so the chain checked is the chain used. It returns
// the Cache it read; nothing is synced when it has no chain with layers.
func (s *syncer) syncTo(ctx context.Context, ref layerfs.CacheRef, bounds *registryRef) (layerfs.SyncResult, *v1alpha1.Cache, error) {
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return layerfs.SyncResult{}, nil, err
	}
	defer unlock()
	cache, err := s.caches.live(ctx, ref)
	if err != nil || cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil || len(cache.Status.Published.Layers) == 0 {
		return layerfs.SyncResult{}, cache, err
	}
	reg, err := s.checkChain(ctx, cache)
	if err != nil {
		return layerfs.SyncResult{}, cache, err
	}
	target, err := s.target(ctx, reg)
	if err != nil {
		return layerfs.SyncResult{}, cache, err
	}
	res, err := s.store.Sync(ctx, ref, chainOf(cache.Status.Published), fetchFrom(target), layerfs.SyncOptions{MaxLayerBytes: bounds.MaxLayerBytes})
	if res.NeedsSquash {
		s.squashes.Add(ref)
	}
	return res, cache, err
}

// checkChain checks the Cache's chain (see trust) and returns the
// registry it may be used with.
func (s *syncer) checkChain(ctx context.Context, cache *v1alpha1.Cache) (*registryRef, error) {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	var applied int64
	info, err := s.store.Inspect(ctx, ref)
	switch {
	case err == nil:
		applied = info.Generation
	case !errors.Is(err, layerfs.ErrNotFound):
		return nil, fmt.Errorf("read cache %s on node %s to check its chain: %w", ref, s.node, err)
	}
	var age time.Duration
	if !cache.CreationTimestamp.IsZero() {
		age = time.Since(cache.CreationTimestamp.Time)
	}
	return s.trust.check(ref, cache.Status.Published, chainCheck{Applied: applied, Age: age})
}

// publish pushes the cache's unpublished layers, oldest first, appends
// each to the Cache's chain, then takes in the layers other nodes appended
// meanwhile, so that every node converges on the same chain. Registry
// failures are retried with backoff by the queue and by the periodic
// pass; the layers stay on the node until they are pushed. A layer that
// cannot be published is reported once and not retried until a commit
// or a squash changes the node's pending layers: retrying the same
// export cannot help.
func (s *syncer) publish(ctx context.Context, ref layerfs.CacheRef) error {
	cache, err := s.caches.live(ctx, ref)
	if err != nil || cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil {
		return err
	}
	err = s.publishTo(ctx, cache)
	var unpublishable *unpublishableError
	switch {
	case errors.Is(err, errPublishBlocked):
		return nil
	case errors.As(err, &unpublishable):
		s.metrics.fail(opPush, failureUnpublishable)
		s.failed(cache, err)
		// It holds back every later layer too, until a commit or a squash.
		return s.withdraw(ctx, layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}, func(a v1alpha1.AnnouncedLayer) bool { return s.settled(ctx, a) }, unpublishable.Error())
	case err != nil:
		s.metrics.fail(opPush, failureReason(err))
		s.failed(cache, err)
		return err
	}
	s.recovered(cache)
	return nil
}

func (s *syncer) publishTo(ctx context.Context, cache *v1alpha1.Cache) error {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	info, err := s.store.Inspect(ctx, ref)
	if errors.Is(err, layerfs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	reg, err := s.checkChain(ctx, cache)
	if err != nil {
		return err
	}
	pending := unpublished(info)
	if len(pending) == 0 && len(announcedBy(cache.Status.Published, s.node)) > 0 {
		// Announced before a restart, then squashed into published layers
		// or lost with the node's store; commits in flight keep theirs.
		if err := s.withdraw(ctx, ref, func(a v1alpha1.AnnouncedLayer) bool { return s.settled(ctx, a) }, "the node has no unpublished layers for it"); err != nil {
			return err
		}
	}
	if s.blocked(ref, pending) {
		return errPublishBlocked
	}
	target, err := s.target(ctx, reg)
	if err != nil {
		return err
	}
	gone := s.goneNodes(ctx, cache.Status.Published.Announced)
	pub, err := s.pushPending(ctx, ref, reg, target, pending, gone, cache.Status.Published)
	if err != nil || pub == nil {
		return err
	}
	squashed, err := s.publishSquashes(ctx, ref, reg, target, info, pub)
	if err != nil {
		return err
	}
	if squashed != nil {
		pub = squashed
	}
	_, synced, err := s.syncTo(ctx, ref, reg)
	if err != nil {
		return fmt.Errorf("take in the layers other nodes published: %w", err)
	}
	if synced != nil && synced.Status.Published != nil {
		pub = synced.Status.Published
	}
	if len(pending) > 0 || squashed != nil {
		if err := target.PushManifest(ctx, blobsBaseFirst(pub)); err != nil {
			// The chain is in the Cache and the blobs are in the registry;
			// the manifest only tags them, and the next publish retries it.
			log.FromContext(ctx).Error(err, "Push the cache's manifest", "cache", ref.String())
		}
	}
	s.reports.Add(ref)
	return nil
}

// pushPending pushes the pending layers in order and returns the chain
// as written; nil if the Cache went away. Order matters: a layer was
// built on the ones below it, and the node keeps its unpublished layers
// on top of the chain, so a layer published past an older unpublished
// one would end up below it on this node. A layer that cannot be
// published therefore holds back the ones after it.
func (s *syncer) pushPending(ctx context.Context, ref layerfs.CacheRef, reg *registryRef, target *remote.Target, pending []layerfs.LayerInfo, gone []string, pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, error) {
	for i, layer := range pending {
		next, err := s.pushLayer(ctx, ref, reg, target, layer, gone)
		if errors.Is(err, layerfs.ErrUnpublishable) {
			s.markStuck(ref, pending)
			return nil, &unpublishableError{cache: ref, layer: layer.ID, held: len(pending) - i - 1, err: err}
		}
		if err != nil || next == nil {
			return nil, err
		}
		pub = next
	}
	return pub, nil
}

// unpublishableError is a layer whose export fails in a way that retrying
// cannot fix (layerfs.ErrUnpublishable names the path and why).
type unpublishableError struct {
	cache layerfs.CacheRef
	layer string
	held  int // later layers it holds back
	err   error
}

func (e *unpublishableError) Error() string {
	return fmt.Sprintf("layer %s of cache %s cannot be published: %v", e.layer, e.cache, e.err)
}

func (e *unpublishableError) Unwrap() error { return e.err }

// pendingKey identifies a set of pending layers: a commit or a squash
// changes it.
func pendingKey(pending []layerfs.LayerInfo) string {
	ids := make([]string, len(pending))
	for i, l := range pending {
		ids[i] = l.ID
	}
	return strings.Join(ids, ",")
}

func (s *syncer) markStuck(ref layerfs.CacheRef, pending []layerfs.LayerInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stuck[ref] = pendingKey(pending)
}

// blocked tells whether the cache's pending layers are those a layer that
// cannot be published held back last time.
func (s *syncer) blocked(ref layerfs.CacheRef, pending []layerfs.LayerInfo) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, ok := s.stuck[ref]
	return ok && key == pendingKey(pending)
}

// sameChain checks a chain re-read for an update: it must still be the
// one this node checked and pushes to, and keep the chain's shape, or the
// node writes nothing to it.
func sameChain(ref layerfs.CacheRef, reg *registryRef, pub *v1alpha1.PublishedChain) error {
	switch {
	case pub.Repository != reg.Repository:
		return &untrustedError{Cache: ref, Field: "repository", Value: fmt.Sprintf("%q", pub.Repository),
			Expected: fmt.Sprintf("%q, where this node checked the chain and pushed the layer (the chain changed under the push)", reg.Repository)}
	case pub.Secret != reg.Secret:
		return &untrustedError{Cache: ref, Field: "secret", Value: fmt.Sprintf("%q", pub.Secret),
			Expected: fmt.Sprintf("%q, which this node checked and pushed with (the chain changed under the push)", reg.Secret)}
	}
	return checkShape(ref, pub)
}

// pushLayer pushes one layer and appends it to the chain, then records
// its digest on the node. In that order: a layer whose digest the node
// records is always in the chain, so a crash in between only makes the
// next publish push the same blob again (exports are deterministic) and
// find it already appended.
//
// The append also settles announcements in the same update (see
// landed): the layer's own goes, and those of gone nodes.
func (s *syncer) pushLayer(ctx context.Context, ref layerfs.CacheRef, reg *registryRef, target *remote.Target, layer layerfs.LayerInfo, gone []string) (*v1alpha1.PublishedChain, error) {
	start := time.Now()
	blob, err := target.PushLayer(ctx, s.tmpDir, func(w io.Writer) error {
		return s.store.ExportLayer(ctx, ref, layer.ID, w)
	})
	if errors.Is(err, layerfs.ErrNotFound) {
		return nil, nil // squashed away meanwhile; the squash is published instead
	}
	if err != nil {
		return nil, err
	}
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var refused error
	cache, err := s.caches.updatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if pub == nil {
			return pub, false
		}
		if slices.ContainsFunc(pub.Layers, func(l v1alpha1.PublishedLayer) bool { return l.Digest == blob.Digest.String() }) {
			return pub, false // appended before a crash, with its announcement
		}
		if refused = sameChain(ref, reg, pub); refused != nil {
			return pub, false
		}
		pub.Announced = s.landed(ctx, pub.Announced, gone)
		pub.Generation++
		pub.Layers = slices.Insert(pub.Layers, 0, v1alpha1.PublishedLayer{
			Digest: blob.Digest.String(), DiffID: blob.DiffID.String(), MediaType: string(blob.MediaType), Size: blob.Size,
			Generation: pub.Generation, Node: s.node,
		})
		return pub, true
	})
	if err == nil {
		err = refused
	}
	if err != nil || cache == nil || cache.Status.Published == nil {
		return nil, err
	}
	if err := s.store.SetLayerDigest(ctx, ref, layer.ID, blob.Digest.String()); err != nil && !errors.Is(err, layerfs.ErrNotFound) {
		return nil, fmt.Errorf("record digest %s of layer %s: %w", blob.Digest, layer.ID, err)
	}
	s.metrics.registryLayers.WithLabelValues("push").Inc()
	s.metrics.registryBytes.WithLabelValues("push").Add(float64(blob.Size))
	s.metrics.registrySeconds.WithLabelValues("push").Observe(time.Since(start).Seconds())
	s.metrics.publishLag.Observe(time.Since(layer.Created).Seconds())
	log.FromContext(ctx).Info("Published", "cache", ref.String(), "layer", layer.ID, "digest", blob.Digest.String(),
		"generation", cache.Status.Published.Generation, "bytes", blob.Size, "tarBytes", blob.TarBytes, "seconds", time.Since(start).Seconds())
	return cache.Status.Published, nil
}

// publishSquashes publishes the node's squashes of published layers, so
// that the chain stays as short as the node's: a squash's blob replaces
// the run of layers it covers, if the chain still has that run (another
// node may have squashed it first, and its squash wins). Nodes that hold
// the covered layers keep them (Sync matches a squash by what it
// covers); new nodes fetch one blob instead of many. It returns the
// chain as written, or nil if nothing was published.
func (s *syncer) publishSquashes(ctx context.Context, ref layerfs.CacheRef, reg *registryRef, target *remote.Target, info layerfs.CacheInfo, pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, error) {
	var out *v1alpha1.PublishedChain
	for _, layer := range info.Layers {
		if layer.Digest != "" || len(layer.Covers) < 2 || coveredRun(pub.Layers, layer.Covers) < 0 {
			continue
		}
		blob, err := target.PushLayer(ctx, s.tmpDir, func(w io.Writer) error {
			return s.store.ExportLayer(ctx, ref, layer.ID, w)
		})
		if errors.Is(err, layerfs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		next, err := s.replaceRun(ctx, ref, reg, layer, blob)
		if err != nil {
			return nil, err
		}
		if next != nil {
			out, pub = next, next
		}
	}
	return out, nil
}

// replaceRun swaps the run of the chain that layer covers for blob, and
// records blob's digest on the node.
func (s *syncer) replaceRun(ctx context.Context, ref layerfs.CacheRef, reg *registryRef, layer layerfs.LayerInfo, blob remote.Blob) (*v1alpha1.PublishedChain, error) {
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	replaced := false
	var refused error
	cache, err := s.caches.updatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		i := -1
		if pub != nil {
			if refused = sameChain(ref, reg, pub); refused != nil {
				return pub, false
			}
			i = coveredRun(pub.Layers, layer.Covers)
		}
		if replaced = i >= 0; !replaced {
			return pub, false
		}
		squash := v1alpha1.PublishedLayer{
			Digest: blob.Digest.String(), DiffID: blob.DiffID.String(), MediaType: string(blob.MediaType), Size: blob.Size,
			Generation: pub.Layers[i].Generation, Node: s.node, Covers: layer.Covers,
		}
		pub.Layers = slices.Replace(pub.Layers, i, i+len(layer.Covers), squash)
		return pub, true
	})
	if err == nil {
		err = refused
	}
	if err != nil || cache == nil || !replaced {
		return nil, err
	}
	if err := s.store.SetLayerDigest(ctx, ref, layer.ID, blob.Digest.String()); err != nil && !errors.Is(err, layerfs.ErrNotFound) {
		return nil, fmt.Errorf("record digest %s of squashed layer %s: %w", blob.Digest, layer.ID, err)
	}
	log.FromContext(ctx).Info("Published squash", "cache", ref.String(), "layer", layer.ID, "digest", blob.Digest.String(), "replaced", len(layer.Covers))
	return cache.Status.Published, nil
}

// coveredRun returns where the digests covers (newest first) run in
// layers, or -1.
func coveredRun(layers []v1alpha1.PublishedLayer, covers []string) int {
	for i := 0; i+len(covers) <= len(layers); i++ {
		match := true
		for j, d := range covers {
			if layers[i+j].Digest != d {
				match = false
				break
			}
		}
		if match {
			return i
		}
	}
	return -1
}

// target resolves a checked registry's repository and the credentials of
// its Secret.
func (s *syncer) target(ctx context.Context, reg *registryRef) (*remote.Target, error) {
	var creds remote.Credentials
	if reg.Secret != "" {
		secret, err := s.secrets(ctx, reg.Secret)
		if err != nil {
			return nil, &secretError{name: reg.Secret, err: err}
		}
		creds = remote.Credentials{DockerConfigJSON: secret.Data[corev1.DockerConfigJsonKey], CAPEM: secret.Data[secretKeyCA]}
	}
	t, err := remote.NewTarget(reg.Repository, creds, s.compression)
	if err != nil {
		return nil, &secretError{name: reg.Secret, err: err}
	}
	return t, nil
}

// secretError is a registry Secret that cannot be read or used.
type secretError struct {
	name string
	err  error
}

func (e *secretError) Error() string {
	return fmt.Sprintf("registry Secret %q of the node agents' namespace: %v", e.name, e.err)
}
func (e *secretError) Unwrap() error { return e.err }

// failureReason is the metric label of a registry failure.
func failureReason(err error) string {
	var secretErr *secretError
	var untrusted *untrustedError
	switch {
	case errors.As(err, &untrusted):
		return failureUntrusted
	case errors.Is(err, layerfs.ErrTooLarge):
		return failureTooLarge
	case errors.Is(err, layerfs.ErrUnpublishable):
		return failureUnpublishable
	case remote.IsUnauthorized(err):
		return "unauthorized"
	case errors.As(err, &secretErr) && apierrors.IsNotFound(err):
		return "secret-not-found"
	case errors.As(err, &secretErr):
		return "invalid-secret"
	case apierrors.IsConflict(err):
		return "conflict"
	}
	return "error"
}

// failed reports a failing publish once per distinct failure, and queues
// a status report, which shows it.
func (s *syncer) failed(cache *v1alpha1.Cache, err error) {
	reason, msg := s.failureEvent(cache, err)
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	s.mu.Lock()
	same := s.failing[ref] == msg
	s.failing[ref] = msg
	s.mu.Unlock()
	if !same {
		s.events.Eventf(cache, nil, corev1.EventTypeWarning, reason, actionPush, "%s", msg)
		s.reports.Add(ref)
	}
}

// failureEvent is the Event reason and message of a failed publish: what
// failed, and what will happen, truthfully.
func (s *syncer) failureEvent(cache *v1alpha1.Cache, err error) (reason, msg string) {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	var unpublishable *unpublishableError
	var untrusted *untrustedError
	switch {
	case errors.As(err, &unpublishable):
		held := ""
		if unpublishable.held > 0 {
			held = fmt.Sprintf(", with the %d layers committed after it (layers are published in order)", unpublishable.held)
		}
		return reasonLayerUnpublishable, fmt.Sprintf("layer %s of cache %s cannot be published because %v; it stays on node %s%s. Retrying will not help: a later commit or a squash of the cache makes a new attempt",
			unpublishable.layer, ref, unpublishable.err, s.node, held)
	case errors.As(err, &untrusted):
		return reasonUntrustedChain, fmt.Sprintf("node %s pushed nothing for cache %s: %v; its layers stay on the node until status.published names a repository and Secret that a StorageClass of this agent pairs", s.node, ref, err)
	case errors.Is(err, layerfs.ErrTooLarge):
		return reasonLayerTooLarge, fmt.Sprintf("node %s could not take in a layer that other nodes published for cache %s: %v; its own layers are pushed first, and the node keeps what it has; raise parameter %s of the cache's StorageClass", s.node, ref, err, paramMaxLayerSize)
	}
	return reasonRegistryFailed, s.failureMessage(cache, err)
}

func (s *syncer) failureMessage(cache *v1alpha1.Cache, err error) string {
	pub := cache.Status.Published
	where := pub.Repository
	if pub.Secret != "" {
		where += fmt.Sprintf(" with the credentials of Secret %q", pub.Secret)
	}
	fix := "the layers stay on node " + s.node + " and are pushed once the registry answers"
	if remote.IsUnauthorized(err) {
		fix = fmt.Sprintf("the registry refused the credentials: fix the Secret's %s (or the registry's accounts); %s", corev1.DockerConfigJsonKey, fix)
	}
	return fmt.Sprintf("pushing cache %s/%s from node %s to %s failed: %v; %s", cache.Namespace, cache.Name, s.node, where, err, fix)
}

// recovered reports that a failing cache publishes again.
func (s *syncer) recovered(cache *v1alpha1.Cache) {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	s.mu.Lock()
	_, was := s.failing[ref]
	delete(s.failing, ref)
	delete(s.stuck, ref)
	s.mu.Unlock()
	if was {
		s.reports.Add(ref)
		s.events.Eventf(cache, nil, corev1.EventTypeNormal, reasonPublished, actionPush,
			"node %s pushed cache %s/%s to %s again; its layers are in the registry", s.node, cache.Namespace, cache.Name, cache.Status.Published.Repository)
	}
}

// publishError is the cache's last publish failure on this node, "" if
// its last publish succeeded.
func (s *syncer) publishError(ref layerfs.CacheRef) string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failing[ref]
}

// needsPublish tells whether the node has layers or a squash to publish.
func needsPublish(info layerfs.CacheInfo, pub *v1alpha1.PublishedChain) bool {
	if len(unpublished(info)) > 0 {
		return true
	}
	return slices.ContainsFunc(info.Layers, func(l layerfs.LayerInfo) bool {
		return l.Digest == "" && len(l.Covers) > 1 && coveredRun(pub.Layers, l.Covers) >= 0
	})
}

// unpublished lists the layers the node has not pushed, oldest first. A
// local squash of published layers (Covers) is in the registry as the
// layers it merged.
func unpublished(info layerfs.CacheInfo) []layerfs.LayerInfo {
	var out []layerfs.LayerInfo
	for _, l := range slices.Backward(info.Layers) {
		if l.Digest == "" && len(l.Covers) == 0 {
			out = append(out, l)
		}
	}
	return out
}

func chainOf(pub *v1alpha1.PublishedChain) layerfs.Chain {
	c := layerfs.Chain{Generation: pub.Generation}
	for _, l := range pub.Layers {
		format := layerfs.FormatTar
		if remote.IsImage(l.MediaType) {
			format = layerfs.FormatEROFS
		}
		c.Layers = append(c.Layers, layerfs.ChainLayer{Digest: l.Digest, Size: l.Size, Format: format, Covers: l.Covers})
	}
	return c
}

// fetchFrom fetches chain layers from target, no further than the size
// the chain states.
func fetchFrom(target *remote.Target) layerfs.Fetch {
	return func(ctx context.Context, l layerfs.ChainLayer) (io.ReadCloser, error) {
		return target.Fetch(ctx, l.Digest, l.Size)
	}
}

func blobsBaseFirst(pub *v1alpha1.PublishedChain) []remote.Blob {
	var out []remote.Blob
	for _, l := range slices.Backward(pub.Layers) {
		out = append(out, remote.BlobOf(l.Digest, l.DiffID, l.MediaType, l.Size))
	}
	return out
}

// keyedLocks are per-cache mutexes that a context can give up on.
type keyedLocks struct {
	mu    sync.Mutex
	locks map[layerfs.CacheRef]chan struct{}
}

func (k *keyedLocks) lock(ctx context.Context, ref layerfs.CacheRef) (unlock func(), err error) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[layerfs.CacheRef]chan struct{}{}
	}
	ch, ok := k.locks[ref]
	if !ok {
		ch = make(chan struct{}, 1)
		k.locks[ref] = ch
	}
	k.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for another sync of cache %s: %w", ref, context.Cause(ctx))
	}
}
