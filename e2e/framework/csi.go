package framework

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
)

// What the CI scenarios with CSI inline volumes check.

// ExpectCSIVolume checks that the pod has the layercache CSI inline volume
// of cache, as a CI system made it from its workflow's spec.
func (f *Framework) ExpectCSIVolume(ctx context.Context, pod, cache string) {
	f.t.Helper()
	p, err := f.Client.CoreV1().Pods(f.Namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("pod %s: %v", pod, err)
	}
	var found []string
	for _, v := range p.Spec.Volumes {
		if v.CSI != nil {
			found = append(found, fmt.Sprintf("%s: driver %s, attributes %v", v.Name, v.CSI.Driver, v.CSI.VolumeAttributes))
			if v.CSI.Driver == v1alpha1.CSIDriverName && v.CSI.VolumeAttributes["cache"] == cache {
				return
			}
		}
	}
	f.t.Fatalf("pod %s has no %s CSI volume of cache %s; its CSI volumes: %q", pod, v1alpha1.CSIDriverName, cache, found)
}

// csiEndReasons are the node agent's Events that end a CSI volume.
var csiEndReasons = []string{"Committed", "Discarded", "CommitDropped", "CommitTorn", "CommitOverLimit"}

// CSIVolumeEnd waits for the node agent's Event on the pod that ends its
// CSI volume (the pod has one) and returns its reason and message.
func (f *Framework) CSIVolumeEnd(ctx context.Context, pod string) (reason, message string) {
	f.t.Helper()
	sel := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod}.AsSelector().String()
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, VolumeTimeout, true, func(ctx context.Context) (bool, error) {
		list, err := f.Client.CoreV1().Events(f.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, ev := range list.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			for _, r := range csiEndReasons {
				if ev.Reason == r {
					reason, message = ev.Reason, ev.Message
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		f.t.Fatalf("the CSI volume of pod %s did not end within %s: %v; the pod's events: %q", pod, VolumeTimeout, err, seen)
	}
	return reason, message
}

// ExpectNoClaims checks that the namespace has no claim and no PV is
// bound to one of it: a CSI inline volume makes neither.
func (f *Framework) ExpectNoClaims(ctx context.Context) {
	f.t.Helper()
	pvcs, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, c := range pvcs.Items {
		f.t.Errorf("claim %s exists (volume %s); a CSI volume makes none", c.Name, c.Spec.VolumeName)
	}
	pvs, err := f.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == f.Namespace {
			f.t.Errorf("PV %s exists for claim %s; a CSI volume makes none", pv.Name, pv.Spec.ClaimRef.Name)
		}
	}
}
