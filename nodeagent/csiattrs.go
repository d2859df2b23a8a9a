package nodeagent

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/layercache/layercache/api/v1alpha1"
)

// The volumeAttributes of a layercache CSI inline volume. Each means what
// the claim annotation of the same name means.
const (
	attrCache    = v1alpha1.CSIAttributeCache
	attrMode     = v1alpha1.CSIAttributeMode
	attrCommit   = "commit"
	attrFallback = "fallback"
	// attrSize is the most the build may add to the cache, as a claim's
	// storage request is.
	attrSize = "size"
)

// The pod information the kubelet adds to the attributes of a driver whose
// CSIDriver object has podInfoOnMount (it overrides any a pod sets).
const (
	attrPodName        = "csi.storage.k8s.io/pod.name"
	attrPodNamespace   = "csi.storage.k8s.io/pod.namespace"
	attrPodUID         = "csi.storage.k8s.io/pod.uid"
	attrServiceAccount = "csi.storage.k8s.io/serviceAccount.name"
	attrEphemeral      = "csi.storage.k8s.io/ephemeral"
)

var userAttrs = []string{attrCache, attrMode, attrCommit, attrFallback, attrSize}

// csiPod is the pod a CSI volume was published for.
type csiPod struct {
	Namespace, Name string
	UID             types.UID
}

func (p csiPod) key() string { return p.Namespace + "/" + p.Name }

// object is a reference to the pod that Events can go on.
func (p csiPod) object() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID}}
}

// parseCSIPod reads the pod information the kubelet passes. Its absence
// means the volume is not an inline volume of a pod, or the CSIDriver
// object lost podInfoOnMount: an installation problem, not the pod's.
func parseCSIPod(attrs map[string]string) (csiPod, error) {
	if attrs[attrEphemeral] != "true" {
		return csiPod{}, fmt.Errorf("the volume is not a CSI inline (ephemeral) volume of a pod: %s serves only volumes declared in a pod's spec.volumes[].csi; for a PersistentVolume use a claim of a layercache StorageClass", v1alpha1.CSIDriverName)
	}
	p := csiPod{Namespace: attrs[attrPodNamespace], Name: attrs[attrPodName], UID: types.UID(attrs[attrPodUID])}
	if p.Namespace == "" || p.Name == "" || p.UID == "" {
		return csiPod{}, fmt.Errorf("the kubelet passed no pod information: the CSIDriver object %s must have spec.podInfoOnMount: true; reinstall layercache's deploy package", v1alpha1.CSIDriverName)
	}
	return p, nil
}

// csiSettings are a CSI volume's attributes as settings, checked for
// unknown attributes and a cache.
func csiSettings(attrs map[string]string, pod csiPod, readOnly bool, limits csiLimits) (settings, error) {
	var unknown []string
	for k := range attrs {
		if !slices.Contains(userAttrs, k) && !strings.HasPrefix(k, "csi.storage.k8s.io/") {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return settings{}, &claimError{Reason: reasonInvalidAttribute, Message: fmt.Sprintf(
			"unknown volumeAttributes %q of driver %s: the valid ones are cache (required), mode, commit, size and fallback", unknown, v1alpha1.CSIDriverName)}
	}
	if attrs[attrCache] == "" {
		return settings{}, &claimError{Reason: reasonInvalidAttribute,
			Message: "volumeAttributes has no cache: name the cache to use, for example cache: maven (or NAMESPACE/NAME for another namespace's cache, read-only)"}
	}
	size, err := limits.size(attrs)
	if err != nil {
		return settings{}, err
	}
	s := settings{terms: csiTerms, Namespace: pod.Namespace, values: map[string]string{},
		Writer: pod.key(), LimitBytes: size.Value(), ReadOnly: readOnly}
	for annotation, attr := range csiTerms.keys {
		if v, ok := attrs[attr]; ok {
			s.values[annotation] = v
		}
	}
	return s, nil
}

// csiLimits bound the size of CSI volumes, in bytes: Default where the
// attribute is absent, Max for the attribute.
type csiLimits struct{ Default, Max int64 }

// size is the volume's limit: its size attribute, or the default.
func (l csiLimits) size(attrs map[string]string) (resource.Quantity, error) {
	v, ok := attrs[attrSize]
	if !ok {
		return *resource.NewQuantity(l.Default, resource.BinarySI), nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return q, &claimError{Reason: reasonInvalidAttribute, Message: fmt.Sprintf(
			"volumeAttributes size has value %q: use a quantity such as 10Gi, the most the build may add to the cache, or remove it for the node's default, %s",
			v, resource.NewQuantity(l.Default, resource.BinarySI))}
	}
	if q.Value() > l.Max {
		return q, &claimError{Reason: reasonInvalidAttribute, Message: fmt.Sprintf(
			"volumeAttributes size has value %q, more than the node agent's --csi-max-size of %s: ask for less, or use a claim of a layercache StorageClass",
			v, resource.NewQuantity(l.Max, resource.BinarySI))}
	}
	return q, nil
}

// csiRequest admits a CSI volume as a claim is admitted, on the defaults
// of a class without parameters (a node-local overlay cache), in a
// namespace that opted in, and never of a cache that syncs through a
// registry.
func (p *Provisioner) csiRequest(ctx context.Context, attrs map[string]string, pod csiPod, readOnly bool, limits csiLimits) (volumeRequest, error) {
	if err := p.caches.csiOptedIn(ctx, pod.Namespace); err != nil {
		return volumeRequest{}, err
	}
	s, err := csiSettings(attrs, pod, readOnly, limits)
	if err != nil {
		return volumeRequest{}, err
	}
	req, err := p.admitVolume(ctx, s, classParams{})
	if err != nil {
		return req, err
	}
	return req, p.refuseRegistryCache(ctx, req)
}

// refuseRegistryCache refuses a CSI volume of a cache that syncs through a
// registry: a CSI volume is node-local, so it would neither pull the
// published generations first nor publish in step, and the node's chain
// would part from the cluster's.
func (p *Provisioner) refuseRegistryCache(ctx context.Context, req volumeRequest) error {
	cache, err := p.caches.get(ctx, req.Cache)
	if err != nil || cache == nil || cache.Status.Published == nil {
		return err
	}
	return &claimError{Reason: reasonRegistryCache, Message: fmt.Sprintf(
		"cache %s syncs across nodes through registry %s, and CSI inline volumes are node-local; use a claim of the cache's StorageClass (label %s on the Cache), or another cache",
		req.Cache, cache.Status.Published.Repository, v1alpha1.LabelStorageClass)}
}
