package nodeagent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSlimClaim(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	claim := func(selected string) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "ws", UID: "uid-ws", ResourceVersion: "7", ManagedFields: managed,
				Annotations: map[string]string{"volume.kubernetes.io/storage-provisioner": "layercache.dev/node", "example.com/big": "..."},
				Labels:      map[string]string{"app": "build"}},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: new("layercache"), VolumeName: "pvc-1"},
		}
		if selected != "" {
			c.Annotations[annSelectedNode] = selected
		}
		return c
	}
	slim := slimClaim("node-a")
	tests := []struct {
		name string
		in   *corev1.PersistentVolumeClaim
		full bool // kept whole but for its managed fields
	}{
		{name: "this node's claim", in: claim("node-a"), full: true},
		{name: "a claim not placed yet", in: claim(""), full: true},
		{name: "another node's claim", in: claim("node-b")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := slim(tt.in.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			got := out.(*corev1.PersistentVolumeClaim)
			if got.ManagedFields != nil {
				t.Errorf("managed fields kept: %v", got.ManagedFields)
			}
			if full := got.Labels != nil && got.Annotations["example.com/big"] != ""; full != tt.full {
				t.Errorf("labels %v, annotations %v: kept whole %v, want %v", got.Labels, got.Annotations, full, tt.full)
			}
			// What the provision controller reads to pass it by stays.
			if got.Name != "ws" || got.UID != "uid-ws" || got.ResourceVersion != "7" || got.Spec.VolumeName != "pvc-1" ||
				*got.Spec.StorageClassName != "layercache" || got.Annotations["volume.kubernetes.io/storage-provisioner"] != "layercache.dev/node" ||
				got.Annotations[annSelectedNode] != tt.in.Annotations[annSelectedNode] {
				t.Errorf("slimmed claim lost what the provision controller reads: %+v", got)
			}
		})
	}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "layercache", ManagedFields: managed}}
	if out, err := slim(class); err != nil || out.(*storagev1.StorageClass).ManagedFields != nil {
		t.Errorf("StorageClass: %v, %v; want it without managed fields", out, err)
	}
}
