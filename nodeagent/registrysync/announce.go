package registrysync

import (
	"context"
	"errors"
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
	"github.com/layercache/layercache/nodeagent/kit"
)

// Read-your-writes across nodes. Committing a large delta (its sync) and
// publishing it take seconds, and for that while a build's result is on
// its node only: a build that starts on another node meanwhile would
// mount the cache without it, and nothing would say so. So a node
// announces each commit in the chain as the build ends, before the commit
// (one Cache update); the append of the commit's layer replaces the
// announcement in the same update; and a node that provisions a volume
// waits, within the class's syncTimeout, for the commits other nodes had
// announced when it started.

const (
	// maxAnnounced bounds the announcements a chain carries (the CRD's
	// MaxItems); a node past it publishes without announcing.
	maxAnnounced = 64

	// announcePoll is how often a waiting node re-reads the Cache.
	announcePoll = 250 * time.Millisecond
)

// Announce records in the cache's chain that node is committing volume,
// if the cache syncs through a registry this node trusts. The volume
// stays in flight until done: the chain updates of a publish meanwhile
// keep its announcement. It never fails the commit: a reader that misses
// the announcement mounts what its node has, as before announcements.
func (s *Syncer) Announce(ctx context.Context, ref layerfs.CacheRef, volume string) {
	s.setInFlight(volume, true)
	// A cache without a published chain (no registry, or none published
	// yet) has nothing to announce into: spare the commit's path a live
	// read. A chain this node's informer has not seen yet only misses
	// one announcement, which is never more than a hint.
	if cached, err := s.caches.Get(ctx, ref); err == nil && (cached == nil || cached.Status.Published == nil) {
		return
	}
	now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
	_, err := s.caches.UpdatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		mine := v1alpha1.AnnouncedLayer{Node: s.node, Volume: volume}
		if pub == nil || len(pub.Announced) >= maxAnnounced || slices.ContainsFunc(pub.Announced, mine.Same) {
			return pub, false
		}
		// Only into a chain of a registry this node serves; publish
		// reports any other.
		if _, err := s.trust.registry(ref, pub); err != nil {
			return pub, false
		}
		mine.Generation, mine.Committed = pub.Generation+int64(len(pub.Announced))+1, now
		pub.Announced = append(pub.Announced, mine)
		return pub, true
	})
	if err != nil {
		log.FromContext(ctx).Error(err, "Announce a commit; readers on other nodes will not wait for it", "cache", ref.String(), "volume", volume)
	}
}

// Committed ends volume's flight. A commit that made no layer (no
// changes, discarded, failed and retried) takes its announcement back.
func (s *Syncer) Committed(ctx context.Context, ref layerfs.CacheRef, volume string, layer bool) {
	s.setInFlight(volume, false)
	if layer {
		return
	}
	mine := func(a v1alpha1.AnnouncedLayer) bool { return a.Node == s.node && a.Volume == volume }
	if err := s.withdraw(ctx, ref, mine, "its commit made no layer"); err != nil {
		log.FromContext(ctx).Error(err, "Withdraw the announcement of a commit that made no layer", "cache", ref.String(), "volume", volume)
	}
}

func (s *Syncer) setInFlight(volume string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.inFlight[volume] = true
	} else {
		delete(s.inFlight, volume)
	}
}

// landed is the change an append of one of this node's layers makes to
// the announcements, in the same update: the oldest of this node's
// settled announcements goes (it is that layer's, or of a commit that
// made its layer before), and those of nodes that are gone are dropped.
func (s *Syncer) landed(ctx context.Context, announced []v1alpha1.AnnouncedLayer, gone []string) []v1alpha1.AnnouncedLayer {
	out := slices.DeleteFunc(slices.Clone(announced), func(a v1alpha1.AnnouncedLayer) bool { return slices.Contains(gone, a.Node) })
	if i := slices.IndexFunc(out, func(a v1alpha1.AnnouncedLayer) bool { return s.settled(ctx, a) }); i >= 0 {
		out = slices.Delete(out, i, i+1)
	}
	return out
}

// settled tells whether a is this node's announcement of a commit that
// is over: not in flight, and its volume gone from the store. A volume
// that is still there (an agent restarted before its commit) will be
// committed, and its announcement stays for it.
func (s *Syncer) settled(ctx context.Context, a v1alpha1.AnnouncedLayer) bool {
	if a.Node != s.node {
		return false
	}
	s.mu.Lock()
	flying := s.inFlight[a.Volume]
	s.mu.Unlock()
	if flying {
		return false
	}
	_, err := s.store.Volume(ctx, a.Volume)
	return errors.Is(err, layerfs.ErrNotFound)
}

// withdraw removes the announcements that which selects, with an Event
// on the Cache naming them and why: the commit made no layer, the node
// has nothing left to publish (after a restart), or its layers cannot be
// published.
func (s *Syncer) withdraw(ctx context.Context, ref layerfs.CacheRef, which func(v1alpha1.AnnouncedLayer) bool, why string) error {
	var withdrawn []string
	cache, err := s.caches.UpdatePublished(ctx, ref, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if pub == nil {
			return pub, false
		}
		withdrawn = withdrawn[:0]
		kept := slices.DeleteFunc(slices.Clone(pub.Announced), func(a v1alpha1.AnnouncedLayer) bool {
			if !which(a) {
				return false
			}
			withdrawn = append(withdrawn, fmt.Sprintf("generation %d (volume %s)", a.Generation, a.Volume))
			return true
		})
		if len(withdrawn) == 0 {
			return pub, false
		}
		pub.Announced = kept
		return pub, true
	})
	if err != nil || cache == nil || len(withdrawn) == 0 {
		return err
	}
	s.events.Eventf(cache, nil, corev1.EventTypeWarning, kit.ReasonAnnouncementWithdrawn, kit.ActionPush,
		"node %s withdrew its announcement of %s of cache %s: %s; builds on other nodes no longer wait for it",
		s.node, strings.Join(withdrawn, ", "), ref, why)
	return nil
}

// announcedBy is node's announcements in the chain.
func announcedBy(pub *v1alpha1.PublishedChain, node string) []v1alpha1.AnnouncedLayer {
	if pub == nil {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(pub.Announced), func(a v1alpha1.AnnouncedLayer) bool { return a.Node != node })
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
func (s *Syncer) awaitAnnounced(ctx context.Context, cache *v1alpha1.Cache) (*v1alpha1.Cache, awaited) {
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
	defer func() { s.metrics.AnnounceWait.WithLabelValues(outcome).Observe(time.Since(start).Seconds()) }()
	tick := time.NewTicker(announcePoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			outcome = "timeout"
			return cache, append(want, skipped...)
		case <-tick.C:
		}
		next, err := s.caches.Live(ctx, ref)
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
// is gone or not Ready, or whose publishing fails (its CacheReplica has
// a publishError, as in a registry outage). Waiting for those would only
// delay every build by the sync timeout.
func (s *Syncer) othersAnnounced(ctx context.Context, cache *v1alpha1.Cache) (wait, skip awaited) {
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
			wait = append(wait, announcement{AnnouncedLayer: a, why: "not published within the StorageClass's " + kit.ParamSyncTimeout})
		} else {
			skip = append(skip, announcement{AnnouncedLayer: a, why: reason})
		}
	}
	return wait, skip
}

// cannotDeliver says why node will not publish soon, or "".
func (s *Syncer) cannotDeliver(ctx context.Context, cache *v1alpha1.Cache, node string) string {
	switch exists, ready := s.nodeState(ctx, node); {
	case !exists:
		return "node " + node + " is gone"
	case !ready:
		return "node " + node + " is not Ready"
	}
	// Another node's replica is not in this agent's informer (it holds
	// this node's only); announcements of other nodes are few.
	var r v1alpha1.CacheReplica
	key := client.ObjectKey{Namespace: cache.Namespace, Name: v1alpha1.CacheReplicaName(cache.Name, node)}
	if err := s.caches.Reader.Get(ctx, key, &r); err == nil && r.Status.PublishError != "" {
		return "node " + node + " cannot publish now: " + r.Status.PublishError
	}
	return ""
}

// goneNodes are the nodes of other nodes' announcements that no longer
// exist: their announcements are dropped by the next chain update.
func (s *Syncer) goneNodes(ctx context.Context, announced []v1alpha1.AnnouncedLayer) []string {
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
func (s *Syncer) nodeState(ctx context.Context, node string) (exists, ready bool) {
	var n corev1.Node
	err := s.caches.Reader.Get(ctx, client.ObjectKey{Name: node}, &n)
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
