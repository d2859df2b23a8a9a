package cachemanager

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// Lifecycle is how long and how large the manager keeps Caches in the
// cluster, where neither the Cache, its StorageClass nor its Namespace
// says otherwise (expire.go, nssize.go).
type Lifecycle struct {
	// CacheMaxAge deletes a Cache that no node has used for this long; 0
	// keeps Caches forever.
	CacheMaxAge time.Duration
	// NamespaceMaxCacheSize bounds the total size of a namespace's caches;
	// nil is no bound.
	NamespaceMaxCacheSize *resource.Quantity
}

// DefaultCacheMaxAge is --cache-max-age's default: 30 days, beyond the
// week or two after which hosted CI caches evict entries, so that a cache
// used once a month still survives.
const DefaultCacheMaxAge = 720 * time.Hour

// Reasons of layercache_caches_deleted_total.
const (
	deletedClusterMaxAge = "cluster-max-age"
	deletedNamespaceSize = "namespace-size"
)

// lastUsed is when the cache was last used on any node: the newest of its
// status.lastUsed, its replicas' and its creation, so that a cache never
// used counts from its creation. The replicas count too because the
// summary may not have caught up with a node's use yet.
func lastUsed(c *v1alpha1.Cache, replicas []v1alpha1.CacheReplica) time.Time {
	t := c.CreationTimestamp.Time
	later := func(u *metav1.Time) {
		if u != nil && u.After(t) {
			t = u.Time
		}
	}
	later(c.Status.LastUsed)
	for i := range replicas {
		later(replicas[i].Status.LastUsed)
	}
	return t
}

// largestCopy is the size of the cache's largest node copy: what it takes
// on a node that holds all of it.
func largestCopy(replicas []v1alpha1.CacheReplica) int64 {
	var size int64
	for _, r := range replicas {
		size = max(size, r.Status.SizeBytes)
	}
	return size
}

// replicasOf lists the Cache's replicas from the informer.
func replicasOf(ctx context.Context, r client.Reader, c *v1alpha1.Cache) ([]v1alpha1.CacheReplica, error) {
	var list v1alpha1.CacheReplicaList
	if err := r.List(ctx, &list, client.InNamespace(c.Namespace), client.MatchingFields{indexReplicaCache: c.Name}); err != nil {
		return nil, fmt.Errorf("listing the replicas of Cache %s/%s: %w", c.Namespace, c.Name, err)
	}
	return list.Items, nil
}

// inUse tells whether a build has a write volume of the cache that has
// not ended: a claim's PV, or a pod's CSI inline volume, which has no PV.
// A build records its use when it mounts, so one that runs longer than a
// max age would look unused, and a CSI build records none until its end;
// deleting its cache would drop its commit.
func inUse(ctx context.Context, c client.Reader, cache *v1alpha1.Cache) (bool, error) {
	ref := cache.Namespace + "/" + cache.Name
	var pvs corev1.PersistentVolumeList
	if err := c.List(ctx, &pvs, client.MatchingFields{indexOpenVolumes: ref}); err != nil {
		return false, fmt.Errorf("listing the volumes of cache %s: %w", ref, err)
	}
	if len(pvs.Items) > 0 {
		return true, nil
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(cache.Namespace), client.MatchingFields{indexCSIWriters: ref}); err != nil {
		return false, fmt.Errorf("listing the pods with CSI volumes of cache %s: %w", ref, err)
	}
	return len(pods.Items) > 0, nil
}

// deleteCache deletes the Cache as the manager saw it: the UID and
// resourceVersion preconditions make the API server refuse if it was
// replaced or changed since (a node used it, a user set its retention),
// so a decision taken on stale data deletes nothing. It returns whether
// the Cache was deleted; a refusal is no error, as the change that caused
// it brings the Cache back to the controller.
func deleteCache(ctx context.Context, c client.Client, cache *v1alpha1.Cache) (bool, error) {
	uid, rv := cache.UID, cache.ResourceVersion
	err := c.Delete(ctx, cache, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("deleting Cache %s/%s: %w", cache.Namespace, cache.Name, err)
	}
}

// roundAge rounds a duration for messages.
func roundAge(d time.Duration) time.Duration {
	if d > time.Hour {
		return d.Round(time.Minute)
	}
	return d.Round(time.Second)
}
