package registrysync

import (
	"context"
	"fmt"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
)

// Deleting a Cache deletes its registry copy too: the manifest that
// "latest" names, so that the registry's own garbage collection frees
// the blobs no other manifest names (a seeded cache's manifest keeps
// the blobs it shares). Node agents hold every Cache with a published
// chain with FinalizerRegistry; on deletion, whichever agent comes first
// checks the chain against its StorageClasses (a forged status.published
// must not make an agent delete what it names), deletes the manifest by
// digest and lifts the finalizer. The others find the manifest gone (a
// 404 counts as done) or the finalizer lifted.

// unpublishGiveUp is how long after a Cache's deletion began the agents
// keep retrying a registry that does not answer; then the Cache goes and
// its registry copy stays, with a Warning that says so.
const unpublishGiveUp = time.Hour

// opUnpublish is the failures metric's operation of a manifest delete.
const opUnpublish = "unpublish"

// Unpublish deletes the registry copy of a Cache being deleted and lifts
// FinalizerRegistry. It returns an error, to be retried with backoff,
// only while the registry may still answer: a refusal (deletes disabled,
// credentials without delete rights) or a chain this agent does not
// trust lifts the finalizer at once with a Warning, and so does a
// registry that has not answered for unpublishGiveUp.
func (s *Syncer) Unpublish(ctx context.Context, cache *v1alpha1.Cache) error {
	if cache.DeletionTimestamp == nil || !controllerutil.ContainsFinalizer(cache, v1alpha1.FinalizerRegistry) {
		return nil
	}
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	// The chain as the API server has it: the informer's copy may be
	// older than the chain's first layer.
	live, err := s.caches.Live(ctx, ref)
	if err != nil || live == nil || !controllerutil.ContainsFinalizer(live, v1alpha1.FinalizerRegistry) {
		return err
	}
	if err := s.deleteManifest(ctx, live); err != nil {
		return err
	}
	s.forgetDeleteFailure(ref)
	return s.caches.ReleaseRegistry(ctx, ref)
}

// deleteManifest deletes the chain's manifest; nil when the finalizer
// may go.
func (s *Syncer) deleteManifest(ctx context.Context, cache *v1alpha1.Cache) error {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	logger := log.FromContext(ctx).WithValues("cache", ref.String())
	pub := cache.Status.Published
	if pub == nil {
		return nil
	}
	reg, err := s.trust.registry(ref, pub)
	if err != nil {
		s.metrics.Fail(opUnpublish, kit.FailureUntrusted)
		s.events.Eventf(cache, nil, corev1.EventTypeWarning, kit.ReasonUntrustedChain, kit.ActionDelete,
			"node %s deleted nothing from any registry for cache %s: %v; if a registry holds a copy of the cache, delete it there by hand", s.node, ref, err)
		logger.Info("Deleted nothing from the registry: the chain is not trusted", "err", err.Error())
		return nil
	}
	var res remote.Deleted
	target, err := s.target(ctx, reg)
	if err == nil {
		res, err = target.DeleteManifest(ctx)
	}
	switch {
	case err == nil && res.Deleted:
		s.events.Eventf(cache, nil, corev1.EventTypeNormal, kit.ReasonManifestDeleted, kit.ActionDelete,
			"node %s deleted manifest %s (tag latest) of %s; the registry's garbage collection frees the blobs no other manifest names", s.node, res.Digest, reg.Repository)
		logger.Info("Deleted the cache's manifest from its registry", "repository", reg.Repository, "digest", res.Digest.String())
		return nil
	case err == nil:
		logger.Info("The cache's manifest is not in its registry (never pushed, or deleted already)", "repository", reg.Repository)
		return nil
	case remote.IsDeleteUnsupported(err) || remote.IsUnauthorized(err):
		s.metrics.Fail(opUnpublish, FailureReason(err))
		s.events.Eventf(cache, nil, corev1.EventTypeWarning, kit.ReasonDeleteRefused, kit.ActionDelete, "%s", refusedMessage(s.node, reg, res.Digest, err))
		logger.Info("The registry refused to delete the cache's manifest; the Cache goes, its registry copy stays", "err", err.Error())
		return nil
	case time.Since(cache.DeletionTimestamp.Time) >= s.unpublishGiveUp():
		s.metrics.Fail(opUnpublish, "gave-up")
		s.events.Eventf(cache, nil, corev1.EventTypeWarning, kit.ReasonDeleteFailed, kit.ActionDelete,
			"node %s gave up deleting the manifest of cache %s from %s after %s: %v; the Cache goes, its registry copy stays: delete it by hand with crane delete %s",
			s.node, ref, reg.Repository, s.unpublishGiveUp(), err, craneTarget(reg.Repository, res.Digest))
		logger.Info("Gave up deleting the cache's manifest; the Cache goes, its registry copy stays", "err", err.Error())
		return nil
	}
	s.metrics.Fail(opUnpublish, FailureReason(err))
	s.deleteFailed(cache, reg, err)
	return fmt.Errorf("delete the manifest of cache %s from %s: %w", ref, reg.Repository, err)
}

// refusedMessage says why the registry refused and what to set.
func refusedMessage(node string, reg *kit.RegistryRef, digest v1.Hash, err error) string {
	why := "the registry does not allow deletes"
	if remote.IsUnauthorized(err) {
		why = "the registry refused the credentials"
		if reg.Secret != "" {
			why += fmt.Sprintf(" of Secret %q", reg.Secret)
		}
		why += " for a delete (give its account delete rights)"
	}
	return fmt.Sprintf("node %s could not delete the manifest of %s: %s (%v). The Cache goes; its registry copy stays. "+
		"Enable deletes in the registry (distribution's config.yml: storage: delete: enabled: true, or REGISTRY_STORAGE_DELETE_ENABLED=true), "+
		"then delete it with crane delete %s and run the registry's garbage collection",
		node, reg.Repository, why, err, craneTarget(reg.Repository, digest))
}

// craneTarget is the argument of a crane delete of the manifest.
func craneTarget(repository string, digest v1.Hash) string {
	if digest.Hex == "" {
		return fmt.Sprintf("%s@$(crane digest %s:latest)", repository, repository)
	}
	return repository + "@" + digest.String()
}

// deleteFailed reports a failing manifest delete once per distinct
// failure: the retries of an outage make one Event, not one each.
func (s *Syncer) deleteFailed(cache *v1alpha1.Cache, reg *kit.RegistryRef, err error) {
	ref := layerfs.CacheRef{Namespace: cache.Namespace, Name: cache.Name}
	msg := err.Error()
	s.mu.Lock()
	same := s.deleteFailing[ref] == msg
	s.deleteFailing[ref] = msg
	s.mu.Unlock()
	if !same {
		deadline := cache.DeletionTimestamp.Add(s.unpublishGiveUp())
		s.events.Eventf(cache, nil, corev1.EventTypeWarning, kit.ReasonDeleteFailed, kit.ActionDelete,
			"node %s could not delete the manifest of cache %s from %s: %v; retried with backoff until %s, then the Cache goes and its registry copy stays",
			s.node, ref, reg.Repository, err, deadline.UTC().Format(time.RFC3339))
	}
}

func (s *Syncer) forgetDeleteFailure(ref layerfs.CacheRef) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.deleteFailing, ref)
}

func (s *Syncer) unpublishGiveUp() time.Duration {
	if s.giveUp > 0 {
		return s.giveUp
	}
	return unpublishGiveUp
}

// UnpushIfDeleting deletes a manifest this node pushed if the Cache's
// deletion began meanwhile: the agent that deleted the registry copy may
// have done so before the push landed, and nothing else would delete it.
// The Cache may be gone, so a failure is logged, not an Event.
func (s *Syncer) UnpushIfDeleting(ctx context.Context, ref layerfs.CacheRef, target *remote.Target, digest v1.Hash) {
	logger := log.FromContext(ctx).WithValues("cache", ref.String(), "digest", digest.String())
	cache, err := s.caches.Live(ctx, ref)
	if err == nil && cache != nil && cache.DeletionTimestamp == nil {
		return
	}
	deleted := false
	if err == nil {
		deleted, err = target.DeleteManifestDigest(ctx, digest)
	}
	switch {
	case err != nil:
		s.metrics.Fail(opUnpublish, FailureReason(err))
		logger.Error(err, "The cache may have been deleted while this node pushed its manifest, and deleting the manifest failed; delete it by hand",
			"command", "crane delete "+craneTarget(target.Repository.String(), digest))
	case deleted:
		logger.Info("Deleted the manifest pushed as the cache's deletion began")
	}
}
