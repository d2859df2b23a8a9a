package volumes

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// LabelNode selects the PVs of one node server-side (the annotation of the
// same name is the identity the DeletionGuard checks).
const LabelNode = v1alpha1.AnnotationNode

// HostnameLabel is the node label that PV node affinity matches.
const HostnameLabel = corev1.LabelHostname

// pvSpec is everything a provisioned PV records.
type pvSpec struct {
	Name     string
	Node     string // node name: identity of the agent that owns the volume
	Hostname string // value of the node's kubernetes.io/hostname label
	Path     string // the hostPath: the volume's mount point, or its gate
	Request  kit.VolumeRequest
	Volume   *layerfs.Volume
	Claim    *corev1.PersistentVolumeClaim
	Class    *storagev1.StorageClass
}

// buildPV returns the hostPath PV of a mounted volume, pinned to its node.
func buildPV(s pvSpec) *corev1.PersistentVolume {
	reclaim := corev1.PersistentVolumeReclaimDelete
	if s.Class.ReclaimPolicy != nil {
		reclaim = *s.Class.ReclaimPolicy
	}
	accessModes := s.Claim.Spec.AccessModes
	if len(accessModes) == 0 {
		accessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	hostPathType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:   s.Name,
			Labels: map[string]string{LabelNode: s.Node},
			Annotations: map[string]string{
				v1alpha1.AnnotationCache:          s.Request.Cache.String(),
				v1alpha1.AnnotationMode:           string(s.Request.Mode),
				v1alpha1.AnnotationCommit:         string(s.Request.Commit),
				v1alpha1.AnnotationBaseGeneration: strconv.FormatInt(s.Volume.BaseGeneration, 10),
				v1alpha1.AnnotationNode:           s.Node,
			},
		},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   accessModes,
			// The volume has no size of its own: it grows on the node's disk.
			// The claim's request is recorded so that the claim binds.
			Capacity: corev1.ResourceList{
				corev1.ResourceStorage: s.Claim.Spec.Resources.Requests[corev1.ResourceStorage],
			},
			VolumeMode: s.Claim.Spec.VolumeMode,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: s.Path, Type: &hostPathType},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{
				Required: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{
						MatchExpressions: []corev1.NodeSelectorRequirement{{
							Key: HostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{s.Hostname},
						}},
					}},
				},
			},
		},
	}
	if s.Volume.SeededFrom != nil {
		pv.Annotations[v1alpha1.AnnotationSeededFrom] = seededFrom(s.Volume)
	}
	return pv
}

// seededFrom is the volume's seed as NAMESPACE/NAME@GENERATION, "" if it
// has none.
func seededFrom(v *layerfs.Volume) string {
	if v.SeededFrom == nil {
		return ""
	}
	return v.SeededFrom.String()
}

// provisioned is what a PV of this agent recorded at provisioning, plus what
// is known of its build's end: the pods' outcome (recorded on the PV, or
// seen by the agent) and, under CommitOnMarker, the build's markers.
type provisioned struct {
	Cache   layerfs.CacheRef
	Mode    v1alpha1.Mode
	Commit  v1alpha1.CommitPolicy
	Outcome string // v1alpha1.Outcome*, or "" when unknown
	Marker  marker
}

// parsePV reads back the annotations buildPV wrote. An error means someone
// edited them; the message says which and how to repair it.
func parsePV(pv *corev1.PersistentVolume) (provisioned, error) {
	var p provisioned
	ann := pv.Annotations
	ref, err := layerfs.ParseCacheRef(ann[v1alpha1.AnnotationCache])
	if err != nil {
		return p, fmt.Errorf("PV %s: annotation %s: %w; restore it to the NAMESPACE/NAME of the volume's cache", pv.Name, v1alpha1.AnnotationCache, err)
	}
	p.Cache = ref
	if p.Mode, err = v1alpha1.ParseMode(ann[v1alpha1.AnnotationMode]); err != nil {
		return p, editedError(pv, err)
	}
	if p.Commit, err = v1alpha1.ParseCommitPolicy(ann[v1alpha1.AnnotationCommit]); err != nil {
		return p, editedError(pv, err)
	}
	// Any other outcome value is as good as none: the pod's result is unknown.
	switch o := ann[v1alpha1.AnnotationPodOutcome]; o {
	case v1alpha1.OutcomeSucceeded, v1alpha1.OutcomeFailed:
		p.Outcome = o
	}
	return p, nil
}

// editedError says that an annotation of the PV no longer holds what
// buildPV wrote there.
func editedError(pv *corev1.PersistentVolume, err error) error {
	return fmt.Errorf("PV %s: %w; restore it to the value the volume was provisioned with", pv.Name, err)
}
