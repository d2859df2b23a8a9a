package kit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// Fallbacks: a claim whose cache has no generation on this node starts
// from the first of its fallbacks that has one (layerfs seeds the volume
// with that cache's layers, shared), so a pull request's first build is as
// warm as its base branch's. The claim annotation names them, or else the
// class's fallback template; the annotation wins, as for the cache.
//
// Across nodes (a class with a registry), a fallback counts only while
// the cache has no generation anywhere: none on this node and no
// published chain with layers. The node then pulls the first fallback
// that has a head here or a trusted published chain, as a read claim of
// it would, and seeds from it (seed.go); the seeded cache's first
// publish mounts the fallback's blobs into its own repository.
//
// A snapshot cache seeds as a writable snapshot of the fallback's
// generation (constant time); its fallbacks must be snapshot caches too,
// which a class's fallbacks of the same class are.

// ParamFallback is the StorageClass parameter that lists the fallbacks of
// claims without the fallback annotation, as a Go template that sees what
// the cache template sees, for example "main" or "{{ .Namespace }}/main".
const ParamFallback = "fallback"

// fallbackFix is how a fallback list is written, for messages.
func (t terms) fallbackFix() string {
	return fmt.Sprintf("use a comma-separated list of at most %d caches, each NAME for a cache of the %s's namespace or NAMESPACE/NAME for another namespace's cache, where both are DNS-1123 labels, for example %s: main",
		v1alpha1.MaxFallbacks, t.holder, t.key(v1alpha1.AnnotationFallback))
}

// parseFallbackClass validates the class's fallback parameter.
func parseFallbackClass(class string, params map[string]string) (*cacheTemplate, error) {
	text, ok := params[ParamFallback]
	if !ok {
		return nil, nil
	}
	return parseTemplate(class, ParamFallback, text, `"main" or "{{ .Namespace }}/main"`)
}

// fallbacks are the fallbacks the volume lists, or else those its
// class's template lists for it, without the volume's own cache (a class
// may fall back to "main" for every cache, main's included) and without
// repeats.
func (s Settings) fallbacks(class ClassParams, cache layerfs.CacheRef) (refs []layerfs.CacheRef, err error) {
	raw, listed := s.get(v1alpha1.AnnotationFallback)
	switch {
	case listed:
		if refs, err = s.parseFallbacks(raw); err != nil {
			return nil, err
		}
	case class.FallbackTemplate != nil:
		if raw, err = fallbackFromTemplate(class, s.template); err != nil {
			return nil, err
		}
		if refs, err = s.parseFallbacks(raw); err != nil {
			return nil, &ClaimError{Reason: ReasonCacheTemplate,
				Message: fmt.Sprintf("StorageClass %q: parameter %s %q listed the fallbacks %q for this claim, which are not valid: %v",
					class.Name, ParamFallback, class.FallbackTemplate.text, raw, err)}
		}
	}
	var out []layerfs.CacheRef
	for _, r := range refs {
		if r != cache && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// parseFallbacks reads a comma-separated list of caches.
func (s Settings) parseFallbacks(value string) ([]layerfs.CacheRef, error) {
	key := v1alpha1.AnnotationFallback
	if strings.TrimSpace(value) == "" {
		return nil, nil // an empty list: no fallbacks
	}
	items := strings.Split(value, ",")
	if len(items) > v1alpha1.MaxFallbacks {
		return nil, s.invalid(key, value, fmt.Sprintf("it lists %d caches; %s", len(items), s.fallbackFix()))
	}
	refs := make([]layerfs.CacheRef, 0, len(items))
	for _, item := range items {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, s.invalid(key, value, "it has an empty entry; "+s.fallbackFix())
		}
		ref, err := s.parseCacheValue(key, item)
		if err != nil {
			return nil, err
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

// fallbackFromTemplate evaluates the class's fallback template.
func fallbackFromTemplate(class ClassParams, data cacheTemplateData) (string, error) {
	var b strings.Builder
	if err := class.FallbackTemplate.tmpl.Execute(&b, data); err != nil {
		who := "the claim"
		if data.Pod.Name != "" {
			who = "pod " + data.Pod.Name
		}
		return "", &ClaimError{Reason: ReasonCacheTemplate,
			Message: fmt.Sprintf("StorageClass %q: parameter %s %q cannot list the fallbacks of this claim (%s): %v; give %s the label or annotation the template uses, or annotate the claim with %s",
				class.Name, ParamFallback, class.FallbackTemplate.text, who, err, who, v1alpha1.AnnotationFallback)}
	}
	return b.String(), nil
}

// AuthorizeFallbacks checks that the volume's namespace may read each
// fallback of another namespace, as a read claim of it is checked
// (authorizeRead): seeding reads the fallback, and never writes it (the
// commit creates the claim's own cache). It returns the fallbacks to use:
// those whose Cache is being deleted go, since seeding from one would
// carry its layers into a new cache after its owner asked them gone.
func (c *Caches) AuthorizeFallbacks(ctx context.Context, namespace string, refs []layerfs.CacheRef, source string) ([]layerfs.CacheRef, error) {
	var out []layerfs.CacheRef
	for _, ref := range refs {
		if ref.Namespace != namespace {
			cache, err := c.AuthorizeRead(ctx, namespace, ref)
			var refused *ClaimError
			if errors.As(err, &refused) {
				return nil, &ClaimError{Reason: refused.Reason, Message: fmt.Sprintf("%s names fallback %s: %s", source, ref, refused.Message)}
			}
			if err != nil {
				return nil, fmt.Errorf("fallback %s: %w", ref, err)
			}
			if cache.DeletionTimestamp == nil {
				out = append(out, ref)
			}
			continue
		}
		cache, err := c.Get(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("fallback %s: %w", ref, err)
		}
		if cache == nil || cache.DeletionTimestamp == nil {
			out = append(out, ref) // a Cache not made yet may still have a head here
		}
	}
	return out, nil
}

// AuthorizeRead checks, on the API server past the informer, that the
// Cache of ref exists and grants namespace read access: what a read claim
// of another namespace's cache needs.
func (c *Caches) AuthorizeRead(ctx context.Context, namespace string, ref layerfs.CacheRef) (*v1alpha1.Cache, error) {
	var cache v1alpha1.Cache
	err := c.Reader.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &cache)
	switch {
	case apierrors.IsNotFound(err):
		return nil, missingCacheDenied(ref, namespace)
	case err != nil:
		return nil, fmt.Errorf("get Cache %s: %w", ref, err)
	case !readerGranted(&cache, namespace):
		return nil, readerDenied(ref, namespace)
	}
	return &cache, nil
}
