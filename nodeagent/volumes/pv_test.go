package volumes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

func TestBuildPV(t *testing.T) {
	retain := corev1.PersistentVolumeReclaimRetain
	fs := corev1.PersistentVolumeFilesystem
	claim := kittest.Claim("ci", nil)
	claim.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
	claim.Spec.VolumeMode = &fs
	claim.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}
	class := kittest.Class(nil)
	class.ReclaimPolicy = &retain
	req := kit.VolumeRequest{Cache: layerfs.CacheRef{Namespace: "ci", Name: "maven"}, Mode: "write", Commit: "always"}
	vol := &layerfs.Volume{ID: "pvc-1", BaseGeneration: 7, MergedPath: "/var/lib/layercache/volumes/pvc-1/merged"}

	got := buildPV(pvSpec{Name: "pvc-1", Node: "node-a", Hostname: "host-a", Path: vol.MergedPath, Request: req, Volume: vol, Claim: claim, Class: class})

	dir := corev1.HostPathDirectory
	want := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "pvc-1",
			Labels: map[string]string{"layercache.dev/node": "node-a"},
			Annotations: map[string]string{
				"layercache.dev/cache":           "ci/maven",
				"layercache.dev/mode":            "write",
				"layercache.dev/commit":          "always",
				"layercache.dev/base-generation": "7",
				"layercache.dev/node":            "node-a",
			},
		},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
			VolumeMode:                    &fs,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/layercache/volumes/pvc-1/merged", Type: &dir},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"host-a"},
				}}}},
			}},
		},
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("buildPV:\n got %+v\nwant %+v", got, want)
	}

	// Defaults: reclaim Delete when the class says nothing, RWO when the
	// claim says nothing.
	class.ReclaimPolicy = nil
	claim.Spec.AccessModes = nil
	got = buildPV(pvSpec{Name: "pvc-1", Node: "node-a", Hostname: "node-a", Path: vol.MergedPath, Request: req, Volume: vol, Claim: claim, Class: class})
	if got.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("reclaim policy %q, want Delete", got.Spec.PersistentVolumeReclaimPolicy)
	}
	if len(got.Spec.AccessModes) != 1 || got.Spec.AccessModes[0] != corev1.ReadWriteOnce {
		t.Errorf("access modes %v, want [ReadWriteOnce]", got.Spec.AccessModes)
	}
}

func testPV(ann map[string]string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1", Annotations: ann}}
}

func TestParsePV(t *testing.T) {
	base := func(extra map[string]string) map[string]string {
		m := map[string]string{
			v1alpha1.AnnotationCache: "ci/maven", v1alpha1.AnnotationMode: "write",
			v1alpha1.AnnotationCommit: "on-success", v1alpha1.AnnotationNode: "node-a",
		}
		for k, v := range extra {
			if v == "-" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	maven := layerfs.CacheRef{Namespace: "ci", Name: "maven"}
	tests := []struct {
		name    string
		ann     map[string]string
		want    provisioned
		wantErr string
	}{
		{name: "no outcome", ann: base(nil), want: provisioned{Cache: maven, Mode: "write", Commit: "on-success"}},
		{name: "succeeded", ann: base(map[string]string{v1alpha1.AnnotationPodOutcome: "succeeded"}),
			want: provisioned{Cache: maven, Mode: "write", Commit: "on-success", Outcome: "succeeded"}},
		{name: "failed", ann: base(map[string]string{v1alpha1.AnnotationPodOutcome: "failed"}),
			want: provisioned{Cache: maven, Mode: "write", Commit: "on-success", Outcome: "failed"}},
		{name: "unknown outcome value is unknown", ann: base(map[string]string{v1alpha1.AnnotationPodOutcome: "Succeeded"}),
			want: provisioned{Cache: maven, Mode: "write", Commit: "on-success"}},
		{name: "cache edited", ann: base(map[string]string{v1alpha1.AnnotationCache: "maven"}), wantErr: "restore it to the NAMESPACE/NAME"},
		{name: "mode removed", ann: base(map[string]string{v1alpha1.AnnotationMode: "-"}), wantErr: `annotation layercache.dev/mode has value ""`},
		{name: "commit edited", ann: base(map[string]string{v1alpha1.AnnotationCommit: "sometimes"}), wantErr: `has value "sometimes"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePV(testPV(tt.ann))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("parsePV = %+v, want %+v", got, tt.want)
			}
		})
	}
}
