package kit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// Caches reads and writes Cache resources for one node agent.
type Caches struct {
	Client client.Client
	// reader reads from the API server, past the informer cache, where a
	// stale answer would remove a cache a claim just created.
	Reader client.Reader
	Node   string
}

// CSIOptedIn refuses CSI inline volumes in a namespace that a cluster
// admin has not labeled v1alpha1.LabelCSI (see there for why).
func (c *Caches) CSIOptedIn(ctx context.Context, namespace string) error {
	var ns corev1.Namespace
	if err := c.Client.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	if ns.Labels[v1alpha1.LabelCSI] == v1alpha1.CSIEnabled {
		return nil
	}
	return &ClaimError{Reason: ReasonCSINotEnabled, Message: fmt.Sprintf(
		"namespace %s has not opted in to CSI inline volumes of %s: a cluster admin labels it (kubectl label namespace %s %s=%s), or its pods use a claim of a layercache StorageClass",
		namespace, v1alpha1.CSIDriverName, namespace, v1alpha1.LabelCSI, v1alpha1.CSIEnabled)}
}

// fieldManager is this node's: it applies the node's CacheReplicas and
// names the node in the Caches' managed fields.
func (c *Caches) fieldManager() string { return "layercache-node-" + c.Node }

// Authorize checks that a claim of namespace may use the cache as asked,
// and creates the Cache of the claim's own namespace on first use. A grant
// to another namespace is read from the API server, past the informer:
// once an owner removes a reader from spec.readers, that reader's next
// claim is refused, not one the informer has yet to hear of.
func (c *Caches) Authorize(ctx context.Context, namespace string, req VolumeRequest) error {
	ref := req.Cache
	var r client.Reader = c.Client
	if ref.Namespace != namespace {
		r = c.Reader
	}
	var cache v1alpha1.Cache
	err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &cache)
	switch {
	case apierrors.IsNotFound(err) && ref.Namespace == namespace:
		return c.create(ctx, ref, req.Class)
	case apierrors.IsNotFound(err):
		return missingCacheDenied(ref, namespace)
	case err != nil:
		return fmt.Errorf("get Cache %s: %w", ref, err)
	}
	if cache.DeletionTimestamp != nil {
		return &ClaimError{Reason: ReasonCacheDeleting,
			Message: fmt.Sprintf("cache %s is being deleted; the claim is retried and gets a new, empty cache once the deletion completes", ref)}
	}
	if ref.Namespace != namespace && !readerGranted(&cache, namespace) {
		return readerDenied(ref, namespace)
	}
	return nil
}

// missingCacheDenied refuses a read of another namespace's cache that
// has no Cache resource.
func missingCacheDenied(ref layerfs.CacheRef, namespace string) error {
	return &ClaimError{Reason: ReasonCacheAccessDenied,
		Message: fmt.Sprintf("cache %s does not exist, so it grants namespace %q nothing; namespace %q must create Cache %q with %q in spec.readers",
			ref, namespace, ref.Namespace, ref.Name, namespace)}
}

// readerDenied refuses a read of another namespace's cache whose Cache
// does not list namespace in spec.readers.
func readerDenied(ref layerfs.CacheRef, namespace string) error {
	return &ClaimError{Reason: ReasonCacheAccessDenied,
		Message: fmt.Sprintf("Cache %s does not grant namespace %q read access; add %q to its spec.readers, for example: kubectl -n %s patch cache %s --type merge -p '{\"spec\":{\"readers\":[%q]}}' (the list replaces the current one)",
			ref, namespace, namespace, ref.Namespace, ref.Name, namespace)}
}

// create makes the Cache of ref, labelled with the claim's class: the
// manager takes the cache's cluster-wide max age from that class. A class
// name too long for a label value (names may have 253 characters, label
// values 63) leaves the label off, and the manager's default applies.
func (c *Caches) create(ctx context.Context, ref layerfs.CacheRef, class string) error {
	cache := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
	if class != "" && len(validation.IsValidLabelValue(class)) == 0 {
		cache.Labels = map[string]string{v1alpha1.LabelStorageClass: class}
	}
	if err := c.Client.Create(ctx, cache, client.FieldOwner(c.fieldManager())); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Cache %s on first use: %w", ref, err)
	}
	return nil
}

// Get returns the Cache of ref from the informer cache, or nil if there
// is none.
func (c *Caches) Get(ctx context.Context, ref layerfs.CacheRef) (*v1alpha1.Cache, error) {
	return readCache(ctx, c.Client, ref)
}

// SyncStatus is what a node reports about a cache that syncs through a
// registry.
type SyncStatus struct {
	// PublishError is the node's last publish failure; "" after a
	// success.
	PublishError string
	// Unpublished counts the layers the node has not pushed.
	Unpublished int
}

// replicaStatus is this node's state of a cache. Unpublished and
// PublishError are reported for a cache that syncs through a registry
// (synced not nil) only.
func replicaStatus(info layerfs.CacheInfo, synced *SyncStatus) v1alpha1.CacheReplicaStatus {
	st := v1alpha1.CacheReplicaStatus{
		Generation: info.Generation, Layers: int32(len(info.Layers)),
		SizeBytes: info.Bytes, LastWriter: info.LastWriter, Filling: int32(info.Filling),
	}
	if seed := info.SeededFrom; seed != nil {
		st.SeededFrom = &v1alpha1.CacheSeed{Namespace: seed.Cache.Namespace, Name: seed.Cache.Name, Generation: seed.Generation}
	}
	if synced != nil {
		st.Unpublished = int32(synced.Unpublished)
		st.PublishError = synced.PublishError
	}
	if !info.LastUsed.IsZero() {
		// The API stores seconds; rounding here keeps repeated applies of an
		// unchanged cache identical, so that they are skipped.
		t := metav1.NewTime(info.LastUsed.Truncate(time.Second))
		st.LastUsed = &t
	}
	return st
}

// replicaKey is this node's CacheReplica of ref.
func (c *Caches) replicaKey(ref layerfs.CacheRef) client.ObjectKey {
	return client.ObjectKey{Namespace: ref.Namespace, Name: v1alpha1.CacheReplicaName(ref.Name, c.Node)}
}

// replica returns this node's CacheReplica of ref from the informer (which
// holds this node's replicas only), or nil if there is none.
func (c *Caches) replica(ctx context.Context, ref layerfs.CacheRef) (*v1alpha1.CacheReplica, error) {
	var r v1alpha1.CacheReplica
	err := c.Client.Get(ctx, c.replicaKey(ref), &r)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get the CacheReplica of cache %s on node %s: %w", ref, c.Node, err)
	}
	return &r, nil
}

// sameStatus tells whether two replica states would be stored alike. The
// comparison goes through JSON, which keeps times to the second as the API
// server does.
func sameStatus(a, b v1alpha1.CacheReplicaStatus) bool {
	have, err1 := json.Marshal(a)
	want, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(have, want)
}

// ApplyStatus states this node's replica of cache, unless it already
// says exactly that: then nothing is sent. The replica names the Cache as
// its owner, so the garbage collector deletes it with a Cache whose
// replicas no node agent is left to delete.
func (c *Caches) ApplyStatus(ctx context.Context, cache *v1alpha1.Cache, info layerfs.CacheInfo, synced *SyncStatus) error {
	st := replicaStatus(info, synced)
	have, err := c.replica(ctx, info.Cache)
	if err != nil {
		return err
	}
	if have != nil && sameStatus(have.Status, st) && slices.ContainsFunc(have.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == cache.UID }) {
		return nil
	}
	b := v1alpha1.CacheReplicaApply(cache.Namespace, cache.Name, cache.UID, c.Node, st)
	if err := c.Client.Apply(ctx, b, client.FieldOwner(c.fieldManager()), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply the CacheReplica of cache %s on node %s: %w", info.Cache, c.Node, err)
	}
	return nil
}

// RemoveStatus deletes this node's replica of ref, if the informer has
// one.
func (c *Caches) RemoveStatus(ctx context.Context, ref layerfs.CacheRef) error {
	have, err := c.replica(ctx, ref)
	if err != nil || have == nil {
		return err
	}
	uid := have.UID
	if err := c.Client.Delete(ctx, have, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete the CacheReplica of cache %s on node %s: %w", ref, c.Node, err)
	}
	return nil
}

// casAttempts bounds the optimistic updates of a Cache's published chain;
// each conflict means another node's write landed, so the loop ends.
const casAttempts = 20

// UpdatePublished changes the Cache's published chain with an optimistic
// lock: it reads the Cache from the API server, lets change edit the chain
// (nil before the first layer; change returns false to write nothing), and
// patches with the read resourceVersion as precondition, re-reading on a
// conflict. The Cache is the sequencer of the chain: two nodes appending
// at once both land, one after the other. It returns the chain as written
// (or as read, when change wrote nothing); nil if the Cache is gone.
func (c *Caches) UpdatePublished(ctx context.Context, ref layerfs.CacheRef, change func(*v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool)) (*v1alpha1.Cache, error) {
	for range casAttempts {
		cache, err := c.Live(ctx, ref)
		if err != nil || cache == nil || cache.DeletionTimestamp != nil {
			return nil, err
		}
		orig := cache.DeepCopy()
		next, changed := change(cache.Status.Published.DeepCopy())
		if !changed {
			return cache, nil
		}
		cache.Status.Published = next
		err = c.Client.Status().Patch(ctx, cache, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}),
			client.FieldOwner(c.fieldManager()))
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("update the published chain of Cache %s: %w", ref, err)
		}
		return cache, nil
	}
	return nil, fmt.Errorf("update the published chain of Cache %s: still conflicting after %d attempts; retried later", ref, casAttempts)
}

// Live reads a Cache from the API server; nil if there is none.
func (c *Caches) Live(ctx context.Context, ref layerfs.CacheRef) (*v1alpha1.Cache, error) {
	return readCache(ctx, c.Reader, ref)
}

func readCache(ctx context.Context, r client.Reader, ref layerfs.CacheRef) (*v1alpha1.Cache, error) {
	var cache v1alpha1.Cache
	err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &cache)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get Cache %s: %w", ref, err)
	}
	return &cache, nil
}

// HoldForRegistry adds FinalizerRegistry to a Cache that has a published
// chain, unless it has it or is being deleted (the API server allows no
// new finalizer then). A conflict re-reads the Cache; a Cache that is
// gone needs nothing.
func (c *Caches) HoldForRegistry(ctx context.Context, cache *v1alpha1.Cache) error {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	for range casAttempts {
		if cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil ||
			controllerutil.ContainsFinalizer(cache, v1alpha1.FinalizerRegistry) {
			return nil
		}
		patch := client.MergeFromWithOptions(cache.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(cache, v1alpha1.FinalizerRegistry)
		err := c.Client.Patch(ctx, cache, patch, client.FieldOwner(c.fieldManager()))
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			return fmt.Errorf("add finalizer %s to Cache %s: %w", v1alpha1.FinalizerRegistry, ref, err)
		}
		if cache, err = c.Live(ctx, ref); err != nil {
			return err
		}
	}
	return fmt.Errorf("add finalizer %s to Cache %s: still conflicting after %d attempts; retried later", v1alpha1.FinalizerRegistry, ref, casAttempts)
}

// ReleaseRegistry lifts FinalizerRegistry; another agent that lifted it
// first, or a Cache that is gone, counts as done.
func (c *Caches) ReleaseRegistry(ctx context.Context, ref layerfs.CacheRef) error {
	for range casAttempts {
		cache, err := c.Live(ctx, ref)
		if err != nil || cache == nil || !controllerutil.ContainsFinalizer(cache, v1alpha1.FinalizerRegistry) {
			return err
		}
		patch := client.MergeFromWithOptions(cache.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(cache, v1alpha1.FinalizerRegistry)
		err = c.Client.Patch(ctx, cache, patch, client.FieldOwner(c.fieldManager()))
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			return fmt.Errorf("remove finalizer %s from Cache %s: %w", v1alpha1.FinalizerRegistry, ref, err)
		}
	}
	return fmt.Errorf("remove finalizer %s from Cache %s: still conflicting after %d attempts; retried later", v1alpha1.FinalizerRegistry, ref, casAttempts)
}
