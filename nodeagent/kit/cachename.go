package kit

import (
	"errors"
	"fmt"
	"strings"
	"text/template"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/podfacts"
)

// ParamCache is the StorageClass parameter that names the cache of claims
// without the cache annotation, as a Go template: for CI systems whose
// charts cannot annotate the claims they make (ARC, Jenkins, Concourse).
const ParamCache = "cache"

// cache is the cache the volume names, or else the one its class's
// template names for it. The volume's own setting wins.
func (s Settings) cache(class ClassParams) (layerfs.CacheRef, error) {
	if raw, ok := s.get(v1alpha1.AnnotationCache); ok {
		return s.parseCacheValue(v1alpha1.AnnotationCache, raw)
	}
	if class.CacheTemplate == nil {
		return layerfs.CacheRef{}, &ClaimError{Reason: s.reason,
			Message: fmt.Sprintf("%s is missing and StorageClass %q has no %s parameter: set the %s to the name of the cache to use, for example %s: maven, or use a class whose %s parameter names it",
				s.field(v1alpha1.AnnotationCache), class.Name, ParamCache, s.noun, s.key(v1alpha1.AnnotationCache), ParamCache)}
	}
	raw, err := cacheFromTemplate(class.Name, class.CacheTemplate, s.template)
	if err != nil {
		return layerfs.CacheRef{}, err
	}
	ref, err := s.parseCacheValue(v1alpha1.AnnotationCache, raw)
	if err != nil {
		return ref, &ClaimError{Reason: ReasonCacheTemplate,
			Message: fmt.Sprintf("StorageClass %q: parameter %s %q named the cache %q for this claim, which is not valid: %v",
				class.Name, ParamCache, class.CacheTemplate.text, raw, err)}
	}
	return ref, nil
}

// parseCacheValue reads NAME (a cache of the volume's namespace) or
// NAMESPACE/NAME, given as setting key.
func (s Settings) parseCacheValue(key, value string) (layerfs.CacheRef, error) {
	fix := "use NAME for a cache of the " + s.holder + "'s namespace or NAMESPACE/NAME for another namespace's cache, where both are DNS-1123 labels (lower-case letters, digits and '-', at most 63 characters)"
	ref := layerfs.CacheRef{Namespace: s.Namespace, Name: value}
	if ns, name, ok := strings.Cut(value, "/"); ok {
		if strings.Contains(name, "/") {
			return ref, s.invalid(key, value, "it has more than one '/'; "+fix)
		}
		ref = layerfs.CacheRef{Namespace: ns, Name: name}
	}
	if err := ref.Validate(); err != nil {
		var invalid *layerfs.InvalidNameError
		if errors.As(err, &invalid) {
			return ref, s.invalid(key, value, fmt.Sprintf("the %s name %q is not valid (%s); %s", invalid.Kind, invalid.Value, invalid.Reason, fix))
		}
		return ref, s.invalid(key, value, fix)
	}
	return ref, nil
}

// cacheTemplateData is what a class's cache template sees.
type cacheTemplateData struct {
	// Namespace is the claim's namespace.
	Namespace string
	Claim     objectData
	// Pod is the pod that owns the claim (a generic ephemeral volume, or a
	// claim a CI plugin made for its pod); empty for a standalone claim.
	Pod objectData
	// Volume is the name of the pod's volume that uses the claim, or the
	// claim's name for a standalone claim.
	Volume string
}

type objectData struct {
	Name        string
	Labels      map[string]string
	Annotations map[string]string
}

func objectDataOf(m metav1.ObjectMeta) objectData {
	return objectData{Name: m.Name, Labels: m.Labels, Annotations: m.Annotations}
}

// cacheTemplate is a class's cache parameter, parsed.
type cacheTemplate struct {
	text string
	tmpl *template.Template
}

// parseCacheTemplate parses a class's cache template. A reference to a
// label or annotation the object lacks fails at evaluation instead of
// naming an accidental cache ("-cache").
func parseCacheTemplate(class, text string) (*cacheTemplate, error) {
	return parseTemplate(class, ParamCache, text, `"{{ .Pod.Labels.app }}-{{ .Volume }}"`)
}

// parseTemplate parses a class's template parameter param (cache or
// fallback); example is a valid value, for the message.
func parseTemplate(class, param, text, example string) (*cacheTemplate, error) {
	t, err := template.New(param).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, classError(class, "parameter %s has value %q, which is not a valid Go template: %v; use for example %s: %s",
			param, text, err, param, example)
	}
	return &cacheTemplate{text: text, tmpl: t}, nil
}

// templateData gathers what the template sees of claim and its owning pod
// (nil for a standalone claim).
func templateData(claim *corev1.PersistentVolumeClaim, pod *corev1.Pod) cacheTemplateData {
	d := cacheTemplateData{Namespace: claim.Namespace, Claim: objectDataOf(claim.ObjectMeta), Volume: claim.Name}
	if pod == nil {
		return d
	}
	d.Pod = objectDataOf(pod.ObjectMeta)
	for _, c := range podfacts.Claims(pod) {
		if c.Name == claim.Name {
			d.Volume = c.Volume
		}
	}
	return d
}

// cacheFromTemplate evaluates the class's template for a claim that does
// not name its cache, and validates the result as the annotation would be.
func cacheFromTemplate(class string, t *cacheTemplate, data cacheTemplateData) (string, error) {
	var b strings.Builder
	if err := t.tmpl.Execute(&b, data); err != nil {
		who := "the claim"
		if data.Pod.Name != "" {
			who = "pod " + data.Pod.Name
		}
		return "", &ClaimError{Reason: ReasonCacheTemplate,
			Message: fmt.Sprintf("StorageClass %q: parameter %s %q cannot name the cache of this claim (%s): %v; give %s the label or annotation the template uses, or annotate the claim with %s",
				class, ParamCache, t.text, who, err, who, v1alpha1.AnnotationCache)}
	}
	return b.String(), nil
}
