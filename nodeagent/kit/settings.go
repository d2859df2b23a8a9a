package kit

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// A volume's user asks for it with settings (cache, mode, commit,
// fallback): a claim's annotations, or a CSI inline volume's attributes.
// Both go through one parser (ParseSettings) and one admission
// (admitVolume); the terms of each name the settings as its user wrote
// them, so that a refusal speaks the user's words.

// terms name a volume's settings in its user's words.
type terms struct {
	// reason is the Event reason of an invalid setting.
	reason string
	// kind is what a setting is called in messages.
	kind string
	// keys maps an annotation key to the user's key; a missing one is
	// the annotation key itself.
	keys map[string]string
	// holder is what carries the settings: "claim" or "pod".
	holder string
	// noun names one setting in "remove the ...".
	noun string
	// fallbackSource names where a volume's fallbacks come from.
	FallbackSource string
}

var (
	claimTerms = terms{
		reason: ReasonInvalidAnnotation, kind: "annotation", holder: "claim", noun: "annotation",
		FallbackSource: fmt.Sprintf("annotation %s or parameter %s", v1alpha1.AnnotationFallback, ParamFallback),
	}
	csiTerms = terms{
		reason: ReasonInvalidAttribute, kind: "volumeAttributes", holder: "pod", noun: "attribute",
		keys: map[string]string{
			v1alpha1.AnnotationCache: AttrCache, v1alpha1.AnnotationMode: AttrMode,
			v1alpha1.AnnotationCommit: AttrCommit, v1alpha1.AnnotationFallback: AttrFallback,
		},
		FallbackSource: "volumeAttributes " + AttrFallback,
	}
)

// key is the user's key of a setting.
func (t terms) key(annotation string) string {
	if k, ok := t.keys[annotation]; ok {
		return k
	}
	return annotation
}

// field names a setting: "annotation layercache.dev/mode", "volumeAttributes mode".
func (t terms) field(annotation string) string { return t.kind + " " + t.key(annotation) }

// invalid refuses a setting's value; fix says what is wrong and the fix.
func (t terms) invalid(annotation, value, fix string) error {
	return &ClaimError{Reason: t.reason, Message: fmt.Sprintf("%s has value %q: %s", t.field(annotation), value, fix)}
}

// refused refuses a value v1alpha1 did not parse; orDefault says what the
// setting's absence means, e.g. " (the default is on-success)".
func (t terms) refused(err error, orDefault string) error {
	var invalid *v1alpha1.InvalidValueError
	if !errors.As(err, &invalid) {
		return &ClaimError{Reason: t.reason, Message: err.Error()}
	}
	return t.invalid(invalid.Annotation, invalid.Value, "use "+invalid.Valid+", or remove the "+t.noun+orDefault)
}

// Settings are what a volume's user asked for, not yet validated.
type Settings struct {
	terms
	// Namespace is the volume's: its claim's, or its CSI volume's pod's.
	Namespace string
	// values are the settings by annotation key.
	values map[string]string
	// Writer names who writes through the volume.
	Writer string
	// LimitBytes is the most the build may add to the cache.
	LimitBytes int64
	// ReadOnly is a volume its pod mounts read-only: nothing it does can
	// be committed, so it is a read view whatever its mode says.
	ReadOnly bool
	// template is what a class's cache and fallback templates see.
	template cacheTemplateData
}

func (s Settings) get(annotation string) (string, bool) {
	v, ok := s.values[annotation]
	return v, ok
}

// ClaimSettings are a claim's annotations and storage request. pod is the
// pod that owns the claim, if any, for the class's templates.
func ClaimSettings(claim *corev1.PersistentVolumeClaim, pod *corev1.Pod) Settings {
	s := Settings{terms: claimTerms, Namespace: claim.Namespace, values: claim.Annotations,
		Writer: writerOf(claim), template: templateData(claim, pod)}
	if q, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		s.LimitBytes = q.Value()
	}
	return s
}

// ParseSettings validates a volume's settings against its class and
// returns what to mount. It does not check access to another namespace's
// cache.
func ParseSettings(s Settings, class ClassParams) (VolumeRequest, error) {
	req := VolumeRequest{
		UID: class.UID, GID: class.GID, Perm: class.Perm, Writer: s.Writer, LimitBytes: s.LimitBytes,
		AllowSetuid: class.AllowSetuid, AllowDevices: class.AllowDevices, Layout: class.Layout,
		Class: class.Name,
	}
	ref, err := s.cache(class)
	if err != nil {
		return req, err
	}
	req.Cache = ref
	if req.Fallbacks, err = s.fallbacks(class, ref); err != nil {
		return req, err
	}
	req.Registry = class.Registry.ForCache(ref, req.LimitBytes)
	if req.Mode, req.ForcedRead, err = s.mode(ref, class); err != nil {
		return req, err
	}
	if s.ReadOnly {
		req.Mode = v1alpha1.ModeRead
	}
	req.Commit, err = s.commit()
	return req, err
}
