package kit

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/layercache/layercache/api/v1alpha1"
)

// The volumeAttributes of a layercache CSI inline volume. Each means what
// the claim annotation of the same name means.
const (
	AttrCache    = v1alpha1.CSIAttributeCache
	AttrMode     = v1alpha1.CSIAttributeMode
	AttrCommit   = "commit"
	AttrFallback = "fallback"
	// AttrSize is the most the build may add to the cache, as a claim's
	// storage request is.
	AttrSize = "size"
	// AttrStorageClass names the StorageClass whose parameters apply.
	AttrStorageClass = v1alpha1.CSIAttributeStorageClass
)

// The pod information the kubelet adds to the attributes of a driver whose
// CSIDriver object has podInfoOnMount (it overrides any a pod sets).
const (
	AttrPodName        = "csi.storage.k8s.io/pod.name"
	AttrPodNamespace   = "csi.storage.k8s.io/pod.namespace"
	AttrPodUID         = "csi.storage.k8s.io/pod.uid"
	AttrServiceAccount = "csi.storage.k8s.io/serviceAccount.name"
	AttrEphemeral      = "csi.storage.k8s.io/ephemeral"
)

var userAttrs = []string{AttrCache, AttrMode, AttrCommit, AttrFallback, AttrSize, AttrStorageClass}

// CSIPod is the pod a CSI volume was published for.
type CSIPod struct {
	Namespace, Name string
	UID             types.UID
}

func (p CSIPod) Key() string { return p.Namespace + "/" + p.Name }

// Object is a reference to the pod that Events can go on.
func (p CSIPod) Object() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID}}
}

// ParseCSIPod reads the pod information the kubelet passes. Its absence
// means the volume is not an inline volume of a pod, or the CSIDriver
// object lost podInfoOnMount: an installation problem, not the pod's.
func ParseCSIPod(attrs map[string]string) (CSIPod, error) {
	if attrs[AttrEphemeral] != "true" {
		return CSIPod{}, fmt.Errorf("the volume is not a CSI inline (ephemeral) volume of a pod: %s serves only volumes declared in a pod's spec.volumes[].csi; for a PersistentVolume use a claim of a layercache StorageClass", v1alpha1.CSIDriverName)
	}
	p := CSIPod{Namespace: attrs[AttrPodNamespace], Name: attrs[AttrPodName], UID: types.UID(attrs[AttrPodUID])}
	if p.Namespace == "" || p.Name == "" || p.UID == "" {
		return CSIPod{}, fmt.Errorf("the kubelet passed no pod information: the CSIDriver object %s must have spec.podInfoOnMount: true; reinstall layercache's deploy package", v1alpha1.CSIDriverName)
	}
	return p, nil
}

// CSISettings are a CSI volume's attributes as settings, checked for
// unknown attributes and a cache.
func CSISettings(attrs map[string]string, pod CSIPod, readOnly bool, limits CSILimits) (Settings, error) {
	var unknown []string
	for k := range attrs {
		if !slices.Contains(userAttrs, k) && !strings.HasPrefix(k, "csi.storage.k8s.io/") {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return Settings{}, &ClaimError{Reason: ReasonInvalidAttribute, Message: fmt.Sprintf(
			"unknown volumeAttributes %q of driver %s: the valid ones are cache (required), mode, commit, size, fallback and storageClass", unknown, v1alpha1.CSIDriverName)}
	}
	if attrs[AttrCache] == "" {
		return Settings{}, &ClaimError{Reason: ReasonInvalidAttribute,
			Message: "volumeAttributes has no cache: name the cache to use, for example cache: maven (or NAMESPACE/NAME for another namespace's cache, read-only)"}
	}
	size, err := limits.size(attrs)
	if err != nil {
		return Settings{}, err
	}
	s := Settings{terms: csiTerms, Namespace: pod.Namespace, values: map[string]string{},
		Writer: pod.Key(), LimitBytes: size.Value(), ReadOnly: readOnly,
		template: cacheTemplateData{Namespace: pod.Namespace, Pod: objectData{Name: pod.Name}}}
	for annotation, attr := range csiTerms.keys {
		if v, ok := attrs[attr]; ok {
			s.values[annotation] = v
		}
	}
	return s, nil
}

// CSIClass is the class whose parameters apply to a CSI volume, validated
// as a claim's class is: the StorageClass its storageClass attribute
// names, or without the attribute a class without parameters (a
// node-local overlay cache). get reads a class by name, nil if there is
// none; its errors are the API's, retried, not the pod's.
func CSIClass(attrs map[string]string, get func(name string) (*storagev1.StorageClass, error)) (ClassParams, error) {
	name, ok := attrs[AttrStorageClass]
	if !ok {
		return ClassParams{}, nil
	}
	fix := fmt.Sprintf("name a StorageClass of provisioner %s (kubectl get storageclass), or remove the attribute for a node-local cache", v1alpha1.ProvisionerName)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return ClassParams{}, &ClaimError{Reason: ReasonInvalidAttribute, Message: fmt.Sprintf(
			"volumeAttributes %s has value %q, which is not a StorageClass name (%s): %s", AttrStorageClass, name, strings.Join(errs, "; "), fix)}
	}
	class, err := get(name)
	if err != nil {
		return ClassParams{}, fmt.Errorf("read StorageClass %q, which volumeAttributes %s names: %w", name, AttrStorageClass, err)
	}
	if class == nil {
		return ClassParams{}, &ClaimError{Reason: ReasonInvalidAttribute, Message: fmt.Sprintf(
			"volumeAttributes %s names StorageClass %q, which does not exist: %s", AttrStorageClass, name, fix)}
	}
	// Another provisioner's parameters mean something else, and may name
	// a registry this node would then push to.
	if class.Provisioner != v1alpha1.ProvisionerName {
		return ClassParams{}, &ClaimError{Reason: ReasonInvalidAttribute, Message: fmt.Sprintf(
			"volumeAttributes %s names StorageClass %q of provisioner %q, not of %s: %s", AttrStorageClass, name, class.Provisioner, v1alpha1.ProvisionerName, fix)}
	}
	return ParseClass(class)
}

// CSINeedsPod tells whether a CSI volume's settings need its pod's
// labels and annotations (Settings.WithPod): its class's fallback
// template lists its fallbacks. Its cache is always its cache attribute,
// which the manager reads from the pod's spec to keep the caches a
// running build writes; a class's cache template does not apply.
func (c ClassParams) CSINeedsPod(attrs map[string]string) bool {
	_, listed := attrs[AttrFallback]
	return c.FallbackTemplate != nil && !listed
}

// WithPod gives a CSI volume's settings what a class's templates see of
// its pod, and the name of the pod's volume.
func (s Settings) WithPod(pod *corev1.Pod, volume string) Settings {
	s.template.Pod = objectDataOf(pod.ObjectMeta)
	s.template.Volume = volume
	return s
}

// CSILimits bound the size of CSI volumes, in bytes: Default where the
// attribute is absent, Max for the attribute.
type CSILimits struct{ Default, Max int64 }

// size is the volume's limit: its size attribute, or the default.
func (l CSILimits) size(attrs map[string]string) (resource.Quantity, error) {
	v, ok := attrs[AttrSize]
	if !ok {
		return *resource.NewQuantity(l.Default, resource.BinarySI), nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return q, &ClaimError{Reason: ReasonInvalidAttribute, Message: fmt.Sprintf(
			"volumeAttributes size has value %q: use a quantity such as 10Gi, the most the build may add to the cache, or remove it for the node's default, %s",
			v, resource.NewQuantity(l.Default, resource.BinarySI))}
	}
	if q.Value() > l.Max {
		return q, &ClaimError{Reason: ReasonInvalidAttribute, Message: fmt.Sprintf(
			"volumeAttributes size has value %q, more than the node agent's --csi-max-size of %s: ask for less, or use a claim of a layercache StorageClass",
			v, resource.NewQuantity(l.Max, resource.BinarySI))}
	}
	return q, nil
}
