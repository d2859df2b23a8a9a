package volumes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// Maintainer keeps the node's caches in line with their Cache resources:
// their CacheReplicas, deletion, retention, squash and GC.
type Maintainer struct {
	node    string
	store   kit.Store
	caches  *kit.Caches
	events  events.EventRecorder
	metrics *kit.Metrics
	gc      layerfs.GCOptions
	reports *kit.CacheQueue
	// publishes pushes caches whose layers are not in their registry yet.
	publishes *kit.CacheQueue
	// sync reports a cache's sync state, publishes and deletes a deleted
	// Cache's registry copy.
	sync RegistrySync
}

// Report states this node's view of a cache on its Cache resource.
func (m *Maintainer) Report(ctx context.Context, ref layerfs.CacheRef) error {
	info, err := m.store.Inspect(ctx, ref)
	if errors.Is(err, layerfs.ErrNotFound) {
		m.metrics.ForgetCache(ref)
		return m.caches.RemoveStatus(ctx, ref)
	}
	if err != nil {
		m.metrics.Fail(kit.OpReport, "store")
		return err
	}
	m.metrics.SetCache(info)
	cache, err := m.caches.Get(ctx, ref)
	if err == nil && cache == nil {
		// A claim's first use creates the Cache just before the provision
		// reports it, often before the informer hears of it; without this
		// read the replica would wait for the next maintenance pass and
		// appear minutes later, beside a build that has long ended.
		cache, err = m.caches.Live(ctx, ref)
	}
	if err != nil || cache == nil || cache.DeletionTimestamp != nil {
		// No resource to report on, or one on its way out whose replica
		// the deletion handler deletes.
		return err
	}
	var synced *kit.SyncStatus
	if cache.Status.Published != nil {
		status := m.sync.Status(ref, info)
		synced = &status
	}
	if err := m.caches.ApplyStatus(ctx, cache, info, synced); err != nil {
		m.metrics.Fail(kit.OpReport, "api")
		return err
	}
	return nil
}

// Squash merges a deep cache's layers, then reports the new shape.
func (m *Maintainer) Squash(ctx context.Context, ref layerfs.CacheRef) error {
	logger := log.FromContext(ctx).WithValues("cache", ref.String())
	start := time.Now()
	// 0: the store's own MaxLayers, the limit that reported NeedsSquash.
	res, err := m.store.Squash(ctx, ref, 0)
	if errors.Is(err, layerfs.ErrNotFound) {
		return nil
	}
	if err != nil {
		m.metrics.Fail(kit.OpSquash, "error")
		return fmt.Errorf("squash cache %s: %w", ref, err)
	}
	if res.Squashed {
		logger.Info("Squashed", "oldLayers", res.OldLayers, "layer", res.Layer, "entries", res.Entries, "took", time.Since(start).Round(time.Millisecond).String())
		m.reports.Add(ref)
		// A squash of published layers shortens the cluster-wide chain too.
		m.publishes.Add(ref)
	}
	return nil
}

// remove deletes a cache from this node and its CacheReplica; it
// tells whether the cache was on the node.
func (m *Maintainer) remove(ctx context.Context, ref layerfs.CacheRef) (bool, error) {
	err := m.store.Remove(ctx, ref)
	if err != nil && !errors.Is(err, layerfs.ErrNotFound) {
		m.metrics.Fail(kit.OpRemove, "error")
		return false, fmt.Errorf("remove cache %s from node %s: %w", ref, m.node, err)
	}
	m.metrics.ForgetCache(ref)
	return err == nil, m.caches.RemoveStatus(ctx, ref)
}

// Reconcile clears a Cache that is being deleted from this node (the
// manager lifts its finalizer once every node's entry is gone) and, if
// no agent did yet, deletes its registry copy. An error retries with the
// controller's backoff.
func (m *Maintainer) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var cache v1alpha1.Cache
	if err := m.caches.Client.Get(ctx, req.NamespacedName, &cache); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if cache.DeletionTimestamp == nil {
		return reconcile.Result{}, nil
	}
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	removed, err := m.remove(ctx, ref)
	if removed {
		log.FromContext(ctx).Info("Removed cache from node, as its Cache is being deleted", "cache", ref.String())
	}
	return reconcile.Result{}, errors.Join(err, m.sync.Unpublish(ctx, &cache))
}

// Pass is the periodic maintenance: the node-wide GC, then per cache
// deletions that were missed, retention and status reports.
func (m *Maintainer) Pass(ctx context.Context) {
	logger := log.FromContext(ctx)
	res, err := m.store.GC(ctx, m.gc)
	if err != nil {
		m.metrics.Fail(kit.OpGC, "error")
		logger.Error(err, "GC")
	}
	for _, ref := range res.RemovedCaches {
		m.metrics.ForgetCache(ref)
		if err := m.caches.RemoveStatus(ctx, ref); err != nil {
			logger.Error(err, "Delete the CacheReplica of a collected cache", "cache", ref.String())
		}
	}
	if len(res.RemovedCaches) > 0 || res.RemovedLayers > 0 {
		logger.Info("GC", "removedCaches", len(res.RemovedCaches), "removedLayers", res.RemovedLayers, "freedBytes", res.FreedBytes)
	}
	infos, err := m.store.List(ctx)
	if err != nil {
		logger.Error(err, "List caches")
		return
	}
	now := time.Now()
	local := map[layerfs.CacheRef]bool{}
	for _, info := range infos {
		if ctx.Err() != nil {
			return
		}
		local[info.Cache] = true
		if err := m.maintainCache(ctx, info, now); err != nil {
			logger.Error(err, "Maintain cache", "cache", info.Cache.String())
		}
	}
	if err := m.withdrawStale(ctx, local); err != nil {
		logger.Error(err, "Delete stale CacheReplicas")
	}
}

// withdrawStale deletes this node's replicas of caches that are not on
// the node (removed with the layerfs CLI, or a store wiped by hand), so
// that status shows the truth and a Cache's deletion is not held up.
func (m *Maintainer) withdrawStale(ctx context.Context, local map[layerfs.CacheRef]bool) error {
	var list v1alpha1.CacheReplicaList
	if err := m.caches.Client.List(ctx, &list); err != nil {
		return fmt.Errorf("list this node's CacheReplicas: %w", err)
	}
	for _, r := range list.Items {
		ref := layerfs.CacheRef{Namespace: r.Namespace, Name: r.Spec.Cache}
		if r.Spec.Node != m.node || local[ref] {
			continue
		}
		// A claim may have created the cache since the list was taken.
		if _, err := m.store.Inspect(ctx, ref); !errors.Is(err, layerfs.ErrNotFound) {
			continue
		}
		if err := m.caches.RemoveStatus(ctx, ref); err != nil {
			return err
		}
		log.FromContext(ctx).Info("Deleted the CacheReplica of a cache that is not on this node", "cache", ref.String())
	}
	return nil
}

func (m *Maintainer) maintainCache(ctx context.Context, info layerfs.CacheInfo, now time.Time) error {
	cache, err := m.caches.Get(ctx, info.Cache)
	if err != nil {
		return err
	}
	switch {
	case cache == nil:
		return m.removeOrphan(ctx, info.Cache)
	case cache.DeletionTimestamp != nil:
		_, err := m.remove(ctx, info.Cache)
		return err
	}
	if why := retentionExceeded(cache.Spec.Retention, info, now); why != "" {
		removed, err := m.removeIfUnused(ctx, info.Cache)
		if err != nil {
			return err
		}
		if removed {
			m.events.Eventf(cache, nil, corev1.EventTypeNormal, kit.ReasonRetention, kit.ActionRemove, "removed the cache from node %s: %s", m.node, why)
			log.FromContext(ctx).Info("Removed cache by its retention", "cache", info.Cache.String(), "why", why)
			return nil
		}
	}
	// Caches published before agents held them for their registry copy.
	if err := m.caches.HoldForRegistry(ctx, cache); err != nil {
		return err
	}
	m.reports.Add(info.Cache)
	if cache.Status.Published != nil && m.sync.Owes(info, cache.Status.Published) {
		m.publishes.Add(info.Cache)
	}
	return nil
}

// removeOrphan removes a cache whose Cache resource no longer exists (it
// went while the agent was away, or with its namespace), unless a build
// writes it: that build's claim made the resource, which the informer has
// not seen yet. The API server has the last word before anything goes.
func (m *Maintainer) removeOrphan(ctx context.Context, ref layerfs.CacheRef) error {
	var cache v1alpha1.Cache
	err := m.caches.Reader.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &cache)
	if !apierrors.IsNotFound(err) {
		return err // it exists after all, or the API server could not say
	}
	removed, err := m.removeIfUnused(ctx, ref)
	if removed {
		log.FromContext(ctx).Info("Removed cache whose Cache resource no longer exists", "cache", ref.String())
	}
	return err
}

// removeIfUnused removes a cache from this node unless a writable volume
// uses it, and deletes its CacheReplica.
func (m *Maintainer) removeIfUnused(ctx context.Context, ref layerfs.CacheRef) (bool, error) {
	removed, err := m.store.RemoveIfUnused(ctx, ref)
	if err != nil {
		m.metrics.Fail(kit.OpRemove, "error")
		return false, fmt.Errorf("remove cache %s from node %s: %w", ref, m.node, err)
	}
	if !removed {
		return false, nil
	}
	m.metrics.ForgetCache(ref)
	return true, m.caches.RemoveStatus(ctx, ref)
}

// retentionExceeded tells why a cache's retention asks to remove it from the
// node, or "" if it does not. Whether a build still writes it is decided
// when it is removed.
func retentionExceeded(r *v1alpha1.Retention, info layerfs.CacheInfo, now time.Time) string {
	if r == nil {
		return ""
	}
	if r.MaxAge != nil && r.MaxAge.Duration > 0 && !info.LastUsed.IsZero() && now.Sub(info.LastUsed) > r.MaxAge.Duration {
		return fmt.Sprintf("unused since %s, longer than its retention maxAge %s", info.LastUsed.UTC().Format(time.RFC3339), r.MaxAge.Duration)
	}
	if r.MaxSize != nil && r.MaxSize.Sign() > 0 && info.Bytes > r.MaxSize.Value() {
		return fmt.Sprintf("%s is larger than its retention maxSize %s", v1alpha1.FormatSize(info.Bytes), r.MaxSize)
	}
	return ""
}

// remount mounts again the volumes of PVs bound on this node whose mounts
// are gone (a reboot, or a lost mount namespace), so their pods find them,
// and opens the mount gate of those whose PV goes through the gate of the
// store at gateRoot. Released PVs are left for Delete, which commits
// unmounted volumes as well.
func remount(ctx context.Context, st kit.Store, events events.EventRecorder, m *kit.Metrics, node, gateRoot string, pvs []*corev1.PersistentVolume) (remounted int) {
	logger := log.FromContext(ctx)
	for _, pv := range pvs {
		if pv.Annotations[v1alpha1.AnnotationNode] != node {
			continue
		}
		// A PV being deleted by hand may still serve a running pod (the
		// protection finalizer holds it), so only the phase counts.
		if pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed {
			continue
		}
		vol, err := st.Volume(ctx, pv.Name)
		if err != nil {
			m.Fail(kit.OpRemount, "missing")
			msg := fmt.Sprintf("volume %s of this PV is not in the store of node %s, so its pod cannot use it: %v", pv.Name, node, err)
			events.Eventf(pv, nil, corev1.EventTypeWarning, kit.ReasonRemountFailed, kit.ActionRemount, "%s", msg)
			logger.Error(err, "PV without volume", "pv", pv.Name)
			continue
		}
		if !vol.Mounted {
			if _, err := st.Mount(ctx, pv.Name, layerfs.MountOptions{Cache: vol.Cache, ReadOnly: vol.ReadOnly, Writer: vol.Writer}); err != nil {
				m.Fail(kit.OpRemount, "error")
				events.Eventf(pv, nil, corev1.EventTypeWarning, kit.ReasonRemountFailed, kit.ActionRemount, "remounting volume %s on node %s failed: %v", pv.Name, node, err)
				logger.Error(err, "Remount", "pv", pv.Name)
				continue
			}
			remounted++
			logger.Info("Remounted", "pv", pv.Name, "cache", vol.Cache.String())
		}
		if gateRoot == "" || pv.Spec.HostPath == nil || pv.Spec.HostPath.Path != gatePath(gateRoot, pv.Name) {
			continue // a PV of before the gate, or a test's
		}
		if err := openGate(gateRoot, pv.Name, vol.MergedPath); err != nil {
			m.Fail(kit.OpRemount, "error")
			events.Eventf(pv, nil, corev1.EventTypeWarning, kit.ReasonRemountFailed, kit.ActionRemount, "volume %s on node %s: %v", pv.Name, node, err)
			logger.Error(err, "Remount", "pv", pv.Name)
		}
	}
	return remounted
}
