package cachemanager

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/layercache/layercache/api/v1alpha1"
)

func TestHoldReconcile(t *testing.T) {
	heldOn := func(node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "build", UID: "uid-build",
				Finalizers: []string{"example.com/keep", v1alpha1.FinalizerBuildEnd}},
			Spec: corev1.PodSpec{NodeName: node},
		}
	}
	deleting := func(pod *corev1.Pod) *corev1.Pod {
		pod.DeletionTimestamp = at(900)
		return pod
	}
	tests := []struct {
		name  string
		pod   *corev1.Pod
		nodes []string
		// fresh are Nodes the API server has and the informer cache not yet.
		fresh []string
		want  []string // the pod's finalizers afterwards
		event string
	}{
		{name: "a pod of an existing Node stays held", pod: heldOn("node-a"), nodes: []string{"node-a"},
			want: []string{"example.com/keep", v1alpha1.FinalizerBuildEnd}},
		{name: "a pod of a deleted Node is released", pod: heldOn("node-gone"), nodes: []string{"node-a"},
			want: []string{"example.com/keep"}, event: "Warning BuildEndLost"},
		{name: "a pod of a Node just created stays held", pod: heldOn("node-new"), nodes: []string{"node-a"}, fresh: []string{"node-new"},
			want: []string{"example.com/keep", v1alpha1.FinalizerBuildEnd}},
		{name: "an unscheduled pod is left alone", pod: heldOn(""), nodes: []string{"node-a"},
			want: []string{"example.com/keep", v1alpha1.FinalizerBuildEnd}},
		{name: "an unscheduled pod that is deleted is released", pod: deleting(heldOn("")), nodes: []string{"node-a"},
			want: []string{"example.com/keep"}, event: "Warning BuildEndLost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			objs := []client.Object{tt.pod}
			for _, n := range tt.nodes {
				objs = append(objs, node(n))
			}
			c := newFakeClient(t, objs...)
			api := c
			if len(tt.fresh) > 0 {
				all := []client.Object{tt.pod.DeepCopy()}
				for _, n := range append(tt.nodes, tt.fresh...) {
					all = append(all, node(n))
				}
				api = newFakeClient(t, all...)
			}
			rec := events.NewFakeRecorder(10)
			r := &HoldReconciler{Client: c, APIReader: api, Recorder: rec}
			// The Node's deletion finds its held pods through the index.
			if reqs := r.heldPodsOfNode(ctx, node(tt.pod.Spec.NodeName)); tt.pod.Spec.NodeName != "" && len(reqs) != 1 {
				t.Errorf("Node %s maps to held pods %v, want the pod", tt.pod.Spec.NodeName, reqs)
			}
			if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "build"}}); err != nil {
				t.Fatal(err)
			}
			var got corev1.Pod
			if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "build"}, &got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Finalizers, tt.want) {
				t.Errorf("finalizers %q, want %q", got.Finalizers, tt.want)
			}
			evs := drain(rec)
			if tt.event == "" && len(evs) > 0 || tt.event != "" && (len(evs) != 1 || !strings.HasPrefix(evs[0], tt.event)) {
				t.Errorf("events %q, want %q", evs, tt.event)
			}
			if reqs := r.heldPodsOfNode(ctx, node("node-gone")); tt.event != "" && len(reqs) != 0 {
				t.Errorf("after the release, the deleted Node still maps to held pods %v", reqs)
			}
		})
	}
}
