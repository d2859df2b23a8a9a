package nodeagent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// Read-your-writes across nodes. Publishing runs after the commit, off
// the build's path, so for a while a committed layer is on its node only.
// A build that starts on another node meanwhile would mount the cache
// without it and nothing would say so. So a node announces each layer
// in the chain as it commits (one Cache update), the append of the layer
// replaces the announcement in the same update, and a node that
// provisions a volume waits, within the class's syncTimeout, for the
// layers other nodes had announced when it started.

const (
	// reasonAnnouncementWithdrawn is the Event of a layer a node announced
	// and will not publish.
	reasonAnnouncementWithdrawn = "AnnouncementWithdrawn"

	// maxAnnounced bounds the announcements a chain carries (the CRD's
	// MaxItems); a node past it publishes without announcing.
	maxAnnounced = 64

	// announcePoll is how often a waiting node re-reads the Cache.
	announcePoll = 250 * time.Millisecond
)

// announce records the layer a commit made in the cache's chain, before
// it is pushed, if the cache syncs through a registry this node trusts.
// It never fails the commit: a reader that misses the announcement
// mounts what its node has, as before announcements.
func (s *syncer) announce(ctx context.Context, ref layerfs.CacheRef, layer string, committed time.Time) {
	if s == nil {
		return
	}
	logger := log.FromContext(ctx).WithValues("cache", ref.String(), "layer", layer)
	cache, err := s.caches.live(ctx, ref)
	if err != nil || cache == nil || cache.DeletionTimestamp != nil || cache.Status.Published == nil {
		if err != nil {
			logger.Error(err, "Read the Cache to announce a commit; readers on other nodes will not wait for it")
		}
		return
	}
	if _, err := s.checkChain(ctx, cache); err != nil {
		return // publish reports the untrusted chain
	}
	_, err = s.caches.updatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		mine := v1alpha1.AnnouncedLayer{Node: s.node, Layer: layer}
		if pub == nil || len(pub.Announced) >= maxAnnounced || slices.ContainsFunc(pub.Announced, mine.Same) {
			return pub, false
		}
		pub.Announced = append(pub.Announced, v1alpha1.AnnouncedLayer{
			Node: s.node, Layer: layer, Generation: pub.Generation + int64(len(pub.Announced)) + 1,
			Committed: metav1.NewTime(committed.UTC().Truncate(time.Second)),
		})
		return pub, true
	})
	if err != nil {
		logger.Error(err, "Announce a commit; readers on other nodes will not wait for it")
	}
}

// keepAnnounced is the change to a chain's announcements that a node's
// chain update carries at no extra write: this node's announcements
// stay only for the layers it still has to publish, and announcements of
// nodes that are gone are dropped.
func (s *syncer) keepAnnounced(announced []v1alpha1.AnnouncedLayer, pending []string, gone []string) []v1alpha1.AnnouncedLayer {
	return slices.DeleteFunc(slices.Clone(announced), func(a v1alpha1.AnnouncedLayer) bool {
		if a.Node == s.node {
			return !slices.Contains(pending, a.Layer)
		}
		return slices.Contains(gone, a.Node)
	})
}

// withdraw removes this node's announcements of layers other than
// pending, with an Event on the Cache naming them and why: the node
// restarted without them, or they cannot be published.
func (s *syncer) withdraw(ctx context.Context, cache *v1alpha1.Cache, pending []string, why string) error {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	var withdrawn []string
	_, err := s.caches.updatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if pub == nil {
			return pub, false
		}
		kept := s.keepAnnounced(pub.Announced, pending, nil)
		if len(kept) == len(pub.Announced) {
			return pub, false
		}
		withdrawn = withdrawn[:0]
		for _, a := range pub.Announced {
			if !slices.ContainsFunc(kept, a.Same) {
				withdrawn = append(withdrawn, fmt.Sprintf("generation %d (layer %s)", a.Generation, a.Layer))
			}
		}
		pub.Announced = kept
		return pub, true
	})
	if err != nil || len(withdrawn) == 0 {
		return err
	}
	s.events.Eventf(cache, nil, corev1.EventTypeWarning, reasonAnnouncementWithdrawn, actionPush,
		"node %s withdrew its announcement of %s of cache %s: %s; builds on other nodes no longer wait for it",
		s.node, strings.Join(withdrawn, ", "), ref, why)
	return nil
}

// announcement is an announced layer a node waited for or skipped, and
// why it did not arrive, if it did not.
type announcement struct {
	v1alpha1.AnnouncedLayer
	why string
}

// awaited are announced layers a node mounts without.
type awaited []announcement

func (w awaited) String() string {
	parts := make([]string, len(w))
	for i, a := range w {
		parts[i] = fmt.Sprintf("generation %d from node %s (committed %s; %s)", a.Generation, a.Node, a.Committed.Format(time.RFC3339), a.why)
	}
	return strings.Join(parts, ", ")
}

// awaitAnnounced waits until none of the layers that other nodes had
// announced in cache's chain, and can deliver, is announced any more
// (each is in the chain, or withdrawn), re-reading the Cache, until ctx
// ends. It returns the Cache as last read and the announcements it did
// not get: those still outstanding, and those it did not wait for.
// It makes no write: readers cost the API server reads only.
func (s *syncer) awaitAnnounced(ctx context.Context, cache *v1alpha1.Cache) (*v1alpha1.Cache, awaited) {
	if cache == nil || cache.Status.Published == nil {
		return cache, nil
	}
	want, skipped := s.othersAnnounced(ctx, cache)
	if len(want) == 0 {
		return cache, skipped
	}
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	start := time.Now()
	outcome := "arrived"
	defer func() { s.metrics.announceWait.WithLabelValues(outcome).Observe(time.Since(start).Seconds()) }()
	tick := time.NewTicker(announcePoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			outcome = "timeout"
			return cache, append(want, skipped...)
		case <-tick.C:
		}
		next, err := s.caches.live(ctx, ref)
		if err != nil || next == nil || next.Status.Published == nil {
			continue
		}
		cache = next
		want = slices.DeleteFunc(want, func(a announcement) bool {
			return !slices.ContainsFunc(cache.Status.Published.Announced, a.Same)
		})
		if len(want) == 0 {
			return cache, skipped
		}
	}
}

// othersAnnounced splits the announcements of other nodes into those
// worth waiting for and those that will not come soon: of a node that
// is gone or not Ready, or whose publishing fails (its status entry has
// a publishError, as in a registry outage). Waiting for those would only
// delay every build by the sync timeout.
func (s *syncer) othersAnnounced(ctx context.Context, cache *v1alpha1.Cache) (wait, skip awaited) {
	why := map[string]string{}
	for _, a := range cache.Status.Published.Announced {
		if a.Node == s.node {
			continue
		}
		reason, seen := why[a.Node]
		if !seen {
			reason = s.cannotDeliver(ctx, cache, a.Node)
			why[a.Node] = reason
		}
		if reason == "" {
			wait = append(wait, announcement{AnnouncedLayer: a, why: "not published within the StorageClass's " + paramSyncTimeout})
		} else {
			skip = append(skip, announcement{AnnouncedLayer: a, why: reason})
		}
	}
	return wait, skip
}

// cannotDeliver says why node will not publish soon, or "".
func (s *syncer) cannotDeliver(ctx context.Context, cache *v1alpha1.Cache, node string) string {
	switch exists, ready := s.nodeState(ctx, node); {
	case !exists:
		return "node " + node + " is gone"
	case !ready:
		return "node " + node + " is not Ready"
	}
	for _, n := range cache.Status.Nodes {
		if n.Node == node && n.PublishError != "" {
			return "node " + node + " cannot publish now: " + n.PublishError
		}
	}
	return ""
}

// goneNodes are the nodes of other nodes' announcements that no longer
// exist: their announcements are dropped by the next chain update.
func (s *syncer) goneNodes(ctx context.Context, announced []v1alpha1.AnnouncedLayer) []string {
	var gone []string
	for _, a := range announced {
		if a.Node == s.node || slices.Contains(gone, a.Node) {
			continue
		}
		if exists, _ := s.nodeState(ctx, a.Node); !exists {
			gone = append(gone, a.Node)
		}
	}
	return gone
}

// nodeState tells whether node exists and is Ready. An error reading it
// counts as both: only an answer that it is gone or down lets a reader
// skip a writer, or a writer drop its announcements.
func (s *syncer) nodeState(ctx context.Context, node string) (exists, ready bool) {
	var n corev1.Node
	err := s.caches.reader.Get(ctx, client.ObjectKey{Name: node}, &n)
	switch {
	case apierrors.IsNotFound(err):
		return false, false
	case err != nil:
		return true, true
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return true, c.Status == corev1.ConditionTrue
		}
	}
	return true, false
}
