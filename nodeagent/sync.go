package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
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
	reasonSyncIncomplete = "SyncIncomplete"
	reasonRegistryFailed = "RegistryFailed"
	reasonPublished      = "Published"
)

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
	node        string
	store       store
	caches      *caches
	secrets     secretGetter
	events      events.EventRecorder
	metrics     *metrics
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
	// failing has each failing cache's last failure, so that an outage
	// makes one Event, not one per retry.
	mu      sync.Mutex
	failing map[layerfs.CacheRef]string
}

// queuePublish queues a publish of the cache; a nil syncer (tests) or
// queue does nothing.
func (s *syncer) queuePublish(ref layerfs.CacheRef) {
	if s != nil {
		s.publishes.Add(ref)
	}
}

// prepare records the class's registry on the Cache the first time a
// claim uses it, so that every node and a restarted agent know where the
// cache syncs to, and returns the cache's chain. The first registry wins:
// a cache's chain lives in one repository.
func (s *syncer) prepare(ctx context.Context, ref layerfs.CacheRef, reg *registryRef) (*v1alpha1.PublishedChain, error) {
	cache, err := s.caches.updatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if pub != nil {
			return pub, false
		}
		return &v1alpha1.PublishedChain{Repository: reg.Repository, Secret: reg.Secret}, true
	})
	if err != nil || cache == nil {
		return nil, err
	}
	return cache.Status.Published, nil
}

// pull brings the node's copy of the cache up to its published chain
// before a volume mounts it, within the class's sync timeout. It never
// fails the claim: past the timeout, or when the registry fails, the
// volume mounts what the node has, and an Event on the claim says so.
func (s *syncer) pull(ctx context.Context, claim *corev1.PersistentVolumeClaim, ref layerfs.CacheRef, reg *registryRef) {
	logger := log.FromContext(ctx).WithValues("cache", ref.String(), "registry", reg.Repository)
	ctx, cancel := context.WithTimeout(ctx, reg.SyncTimeout)
	defer cancel()
	start := time.Now()
	pub, err := s.prepare(ctx, ref, reg)
	var target *remote.Target
	if err == nil && pub != nil && len(pub.Layers) > 0 {
		target, err = s.target(ctx, pub)
	}
	if target != nil && err == nil {
		var res layerfs.SyncResult
		res, _, err = s.syncTo(ctx, ref, target)
		if err == nil && res.Fetched > 0 {
			s.metrics.registryLayers.WithLabelValues("pull").Add(float64(res.Fetched))
			s.metrics.registryBytes.WithLabelValues("pull").Add(float64(res.FetchedBytes))
			s.metrics.registrySeconds.WithLabelValues("pull").Observe(time.Since(start).Seconds())
			logger.Info("Pulled", "layers", res.Fetched, "bytes", res.FetchedBytes, "generation", res.Generation, "seconds", time.Since(start).Seconds())
		}
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		s.metrics.fail(opPull, "timeout")
		s.events.Eventf(claim, nil, corev1.EventTypeWarning, reasonSyncIncomplete, actionPull,
			"the layers of cache %s that node %s lacks did not arrive from %s within the StorageClass's %s of %s, so the volume mounts what the node has (a colder cache); raise %s if builds wait for it gladly: %v",
			ref, s.node, reg, paramSyncTimeout, reg.SyncTimeout, paramSyncTimeout, err)
		logger.Info("Pull incomplete; mounting what the node has", "err", err.Error())
	default:
		s.metrics.fail(opPull, failureReason(err))
		s.events.Eventf(claim, nil, corev1.EventTypeWarning, reasonRegistryFailed, actionPull,
			"could not bring cache %s up to date from %s, so the volume mounts what node %s has: %v", ref, reg, s.node, err)
		logger.Error(err, "Pull failed; mounting what the node has")
	}
}

// syncTo makes the node's head the Cache's published chain, under the
// cache's lock. The chain is read under the lock: one read before it could
// predate a layer this node appended meanwhile, and a Sync to it would
// drop that layer from the head. It returns the chain it synced to; nil
// when the Cache has none (gone, or not synced through a registry).
func (s *syncer) syncTo(ctx context.Context, ref layerfs.CacheRef, target *remote.Target) (layerfs.SyncResult, *v1alpha1.PublishedChain, error) {
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return layerfs.SyncResult{}, nil, err
	}
	defer unlock()
	cache, err := s.caches.live(ctx, ref)
	if err != nil || cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil {
		return layerfs.SyncResult{}, nil, err
	}
	pub := cache.Status.Published
	res, err := s.store.Sync(ctx, ref, chainOf(pub), target.Fetch, layerfs.SyncOptions{})
	if res.NeedsSquash {
		s.squashes.Add(ref)
	}
	return res, pub, err
}

// publish pushes the cache's unpublished layers, oldest first, appends
// each to the Cache's chain, then takes in the layers other nodes appended
// meanwhile, so that every node converges on the same chain. Failures are
// retried with backoff by the queue and by the periodic pass; the layers
// stay on the node until they are pushed.
func (s *syncer) publish(ctx context.Context, ref layerfs.CacheRef) error {
	cache, err := s.caches.live(ctx, ref)
	if err != nil || cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil {
		return err
	}
	err = s.publishTo(ctx, cache)
	if err != nil {
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
	target, err := s.target(ctx, cache.Status.Published)
	if err != nil {
		return err
	}
	pending := unpublished(info)
	pub := cache.Status.Published
	for _, layer := range pending {
		if pub, err = s.pushLayer(ctx, ref, target, layer); err != nil {
			return err
		}
		if pub == nil {
			return nil // the Cache went away
		}
	}
	squashed, err := s.publishSquashes(ctx, ref, target, info, pub)
	if err != nil {
		return err
	}
	if squashed != nil {
		pub = squashed
	}
	_, synced, err := s.syncTo(ctx, ref, target)
	if err != nil {
		return fmt.Errorf("take in the layers other nodes published: %w", err)
	}
	if synced != nil {
		pub = synced
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

// pushLayer pushes one layer and appends it to the chain, then records
// its digest on the node. In that order: a layer whose digest the node
// records is always in the chain, so a crash in between only makes the
// next publish push the same blob again (exports are deterministic) and
// find it already appended.
func (s *syncer) pushLayer(ctx context.Context, ref layerfs.CacheRef, target *remote.Target, layer layerfs.LayerInfo) (*v1alpha1.PublishedChain, error) {
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
	cache, err := s.caches.updatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if pub == nil || slices.ContainsFunc(pub.Layers, func(l v1alpha1.PublishedLayer) bool { return l.Digest == blob.Digest.String() }) {
			return pub, false
		}
		pub.Generation++
		pub.Layers = slices.Insert(pub.Layers, 0, v1alpha1.PublishedLayer{
			Digest: blob.Digest.String(), DiffID: blob.DiffID.String(), MediaType: string(blob.MediaType), Size: blob.Size,
			Generation: pub.Generation, Node: s.node,
		})
		return pub, true
	})
	if err != nil || cache == nil || cache.Status.Published == nil {
		return nil, err
	}
	if err := s.store.SetLayerDigest(ctx, ref, layer.ID, blob.Digest.String()); err != nil && !errors.Is(err, layerfs.ErrNotFound) {
		return nil, fmt.Errorf("record digest %s of layer %s: %w", blob.Digest, layer.ID, err)
	}
	s.metrics.registryLayers.WithLabelValues("push").Inc()
	s.metrics.registryBytes.WithLabelValues("push").Add(float64(blob.Size))
	s.metrics.registrySeconds.WithLabelValues("push").Observe(time.Since(start).Seconds())
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
func (s *syncer) publishSquashes(ctx context.Context, ref layerfs.CacheRef, target *remote.Target, info layerfs.CacheInfo, pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, error) {
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
		next, err := s.replaceRun(ctx, ref, layer, blob)
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
func (s *syncer) replaceRun(ctx context.Context, ref layerfs.CacheRef, layer layerfs.LayerInfo, blob remote.Blob) (*v1alpha1.PublishedChain, error) {
	unlock, err := s.locks.lock(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	replaced := false
	cache, err := s.caches.updatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		i := -1
		if pub != nil {
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

// target resolves a chain's repository and the credentials of its Secret.
func (s *syncer) target(ctx context.Context, pub *v1alpha1.PublishedChain) (*remote.Target, error) {
	var creds remote.Credentials
	if pub.Secret != "" {
		secret, err := s.secrets(ctx, pub.Secret)
		if err != nil {
			return nil, &secretError{name: pub.Secret, err: err}
		}
		creds = remote.Credentials{DockerConfigJSON: secret.Data[corev1.DockerConfigJsonKey], CAPEM: secret.Data[secretKeyCA]}
	}
	t, err := remote.NewTarget(pub.Repository, creds, s.compression)
	if err != nil {
		return nil, &secretError{name: pub.Secret, err: err}
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
	switch {
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

// failed reports a failing publish once per distinct failure.
func (s *syncer) failed(cache *v1alpha1.Cache, err error) {
	msg := s.failureMessage(cache, err)
	s.mu.Lock()
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	same := s.failing[ref] == msg
	s.failing[ref] = msg
	s.mu.Unlock()
	if !same {
		s.events.Eventf(cache, nil, corev1.EventTypeWarning, reasonRegistryFailed, actionPush, "%s", msg)
	}
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
	s.mu.Unlock()
	if was {
		s.events.Eventf(cache, nil, corev1.EventTypeNormal, reasonPublished, actionPush,
			"node %s pushed cache %s/%s to %s again; its layers are in the registry", s.node, cache.Namespace, cache.Name, cache.Status.Published.Repository)
	}
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
		c.Layers = append(c.Layers, layerfs.ChainLayer{Digest: l.Digest, Size: l.Size, Covers: l.Covers})
	}
	return c
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
