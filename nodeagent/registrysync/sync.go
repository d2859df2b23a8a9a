package registrysync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
)

// Keys of a registry Secret: .dockerconfigjson as in image pull secrets,
// and an optional CA bundle.
const (
	SecretKeyCA = "ca.crt"
)

// SecretGetter reads a Secret of the node agents' namespace.
type SecretGetter func(ctx context.Context, name string) (*corev1.Secret, error)

// Config is what a Syncer is made of. Every field is required but
// UnpublishGiveUp.
type Config struct {
	Node    string
	Store   kit.Store
	Caches  *kit.Caches
	Events  events.EventRecorder
	Metrics *kit.Metrics
	// Classes are the StorageClasses the agent serves, from its shared
	// informer: every chain read is checked against them (trust.go).
	Classes storagelisters.StorageClassLister
	// Secrets reads a registry Secret of the agents' namespace.
	Secrets SecretGetter
	// TmpDir holds the images being pushed; Compression is their blobs'.
	TmpDir      string
	Compression remote.Compression
	// Reports, Squashes and Publishes are the agent's queues the syncer
	// feeds; the agent runs Publishes with Publish.
	Reports, Squashes, Publishes *kit.CacheQueue
	// UnpublishGiveUp overrides unpublishGiveUp (tests).
	UnpublishGiveUp time.Duration
}

// Syncer keeps a node's caches in step with their registries. The Cache
// resource's status.published is the cluster-wide chain; the registry
// holds the layers. After a commit the node pushes its new layers
// (publish.go) and appends them to the chain (chain.go); before a mount it
// fetches the layers of the chain it lacks (pull.go).
type Syncer struct {
	node    string
	store   kit.Store
	caches  *kit.Caches
	secrets SecretGetter
	events  events.EventRecorder
	metrics *kit.Metrics
	// trust checks every chain read against the classes the agent
	// serves.
	trust       *trust
	tmpDir      string
	compression remote.Compression
	reports     *kit.CacheQueue
	squashes    *kit.CacheQueue
	publishes   *kit.CacheQueue
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
	// deleteFailing has each deleted Cache's last failure to delete its
	// manifest (unpublish.go), so that an outage makes one Event.
	deleteFailing map[layerfs.CacheRef]string
	giveUp        time.Duration
}

// New makes the syncer of c.Node.
func New(c Config) *Syncer {
	return &Syncer{
		node: c.Node, store: c.Store, caches: c.Caches, secrets: c.Secrets, events: c.Events, metrics: c.Metrics,
		trust: &trust{classes: c.Classes}, tmpDir: c.TmpDir, compression: c.Compression,
		reports: c.Reports, squashes: c.Squashes, publishes: c.Publishes,
		failing: map[layerfs.CacheRef]string{}, stuck: map[layerfs.CacheRef]string{}, inFlight: map[string]bool{},
		deleteFailing: map[layerfs.CacheRef]string{}, giveUp: c.UnpublishGiveUp,
	}
}

// QueuePublish queues a publish of the cache.
func (s *Syncer) QueuePublish(ref layerfs.CacheRef) {
	s.publishes.Add(ref)
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
func (s *Syncer) prepare(ctx context.Context, claimNamespace string, req kit.VolumeRequest) error {
	if claimNamespace != req.Cache.Namespace || req.Mode != v1alpha1.ModeWrite {
		return nil
	}
	reg := req.Registry
	cache, err := s.caches.UpdatePublished(ctx, req.Cache, func(pub *v1alpha1.PublishedChain) (*v1alpha1.PublishedChain, bool) {
		if pub != nil && (len(pub.Layers) > 0 || pub.Repository == reg.Repository && pub.Secret == reg.Secret) {
			return pub, false
		}
		return &v1alpha1.PublishedChain{Repository: reg.Repository, Secret: reg.Secret}, true
	})
	if err != nil || cache == nil {
		return err
	}
	// Before any layer is pushed: deleting the Cache then deletes its
	// registry copy (unpublish.go). A failure must not make the build
	// cold; the periodic pass adds it later.
	if err := s.caches.HoldForRegistry(ctx, cache); err != nil {
		log.FromContext(ctx).Error(err, "Hold the Cache for its registry copy; the periodic pass retries", "cache", req.Cache.String())
	}
	return nil
}

// target resolves a checked registry's repository and the credentials of
// its Secret.
func (s *Syncer) target(ctx context.Context, reg *kit.RegistryRef) (*remote.Target, error) {
	var creds remote.Credentials
	if reg.Secret != "" {
		secret, err := s.secrets(ctx, reg.Secret)
		if err != nil {
			return nil, &secretError{name: reg.Secret, err: err}
		}
		creds = remote.Credentials{DockerConfigJSON: secret.Data[corev1.DockerConfigJsonKey], CAPEM: secret.Data[SecretKeyCA]}
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

// FailureReason is the metric label of a registry failure.
func FailureReason(err error) string {
	var secretErr *secretError
	var untrusted *untrustedError
	switch {
	case errors.As(err, &untrusted):
		return kit.FailureUntrusted
	case errors.Is(err, layerfs.ErrTooLarge):
		return kit.FailureTooLarge
	case errors.Is(err, layerfs.ErrInvalidImage):
		return kit.FailureInvalidImage
	case errors.Is(err, layerfs.ErrNoSpace):
		return kit.FailureNoSpace
	case errors.Is(err, layerfs.ErrUnpublishable):
		return kit.FailureUnpublishable
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
func (s *Syncer) failed(cache *v1alpha1.Cache, err error) {
	reason, msg := s.failureEvent(cache, err)
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	s.mu.Lock()
	same := s.failing[ref] == msg
	s.failing[ref] = msg
	s.mu.Unlock()
	if !same {
		s.events.Eventf(cache, nil, corev1.EventTypeWarning, reason, kit.ActionPush, "%s", msg)
		s.reports.Add(ref)
	}
}

// failureEvent is the Event reason and message of a failed publish: what
// failed, and what will happen, truthfully.
func (s *Syncer) failureEvent(cache *v1alpha1.Cache, err error) (reason, msg string) {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	var unpublishable *unpublishableError
	var untrusted *untrustedError
	switch {
	case errors.As(err, &unpublishable):
		held := ""
		if unpublishable.held > 0 {
			held = fmt.Sprintf(", with the %d layers committed after it (layers are published in order)", unpublishable.held)
		}
		return kit.ReasonLayerUnpublishable, fmt.Sprintf("layer %s of cache %s cannot be published because %v; it stays on node %s%s. Retrying will not help: a later commit or a squash of the cache makes a new attempt",
			unpublishable.layer, ref, unpublishable.err, s.node, held)
	case errors.As(err, &untrusted):
		return kit.ReasonUntrustedChain, fmt.Sprintf("node %s pushed nothing for cache %s: %v; its layers stay on the node until status.published names a repository and Secret that a StorageClass of this agent pairs", s.node, ref, err)
	case errors.Is(err, layerfs.ErrTooLarge):
		return kit.ReasonLayerTooLarge, fmt.Sprintf("node %s could not take in a layer that other nodes published for cache %s: %v; its own layers are pushed first, and the node keeps what it has; raise parameter %s of the cache's StorageClass", s.node, ref, err, kit.ParamMaxLayerSize)
	case errors.Is(err, layerfs.ErrInvalidImage):
		return kit.ReasonUntrustedChain, invalidImageMessage(s.node, ref, err)
	}
	return kit.ReasonRegistryFailed, s.failureMessage(cache, err)
}

func (s *Syncer) failureMessage(cache *v1alpha1.Cache, err error) string {
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
func (s *Syncer) recovered(cache *v1alpha1.Cache) {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	s.mu.Lock()
	_, was := s.failing[ref]
	delete(s.failing, ref)
	delete(s.stuck, ref)
	s.mu.Unlock()
	if was {
		s.reports.Add(ref)
		s.events.Eventf(cache, nil, corev1.EventTypeNormal, kit.ReasonPublished, kit.ActionPush,
			"node %s pushed cache %s/%s to %s again; its layers are in the registry", s.node, cache.Namespace, cache.Name, cache.Status.Published.Repository)
	}
}

// PublishError is the cache's last publish failure on this node, "" if
// its last publish succeeded.
func (s *Syncer) PublishError(ref layerfs.CacheRef) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failing[ref]
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

// invalidImageMessage says that a pulled image was refused, and why it
// is not retried as an outage would be.
func invalidImageMessage(node string, ref layerfs.CacheRef, err error) string {
	return fmt.Sprintf("node %s refused a layer image of cache %s from the registry and mounts what it has: %v; the image was not written by a layercache node agent (or was changed in the registry), so the same bytes will be refused again: delete the Cache, and every node starts it anew", node, ref, err)
}
