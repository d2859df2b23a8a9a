package framework

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/layercache/layercache/api/v1alpha1"
)

// layercacheGVRs are layercache's resources: Caches and their
// CacheReplicas.
var layercacheGVRs = []schema.GroupVersionResource{
	v1alpha1.GroupVersion.WithResource("caches"),
	v1alpha1.GroupVersion.WithResource("cachereplicas"),
}

// NamespaceWrites summarises what any write to the test namespace's
// claims, their PVs, its Caches and CacheReplicas, its Events and its objects of the extra
// resources (a CI system's own, e.g. Argo's workflows) would change:
// names, UIDs, resourceVersions, counts. Two equal summaries some minutes
// apart mean nothing wrote there: the pattern of the tests that catch an
// API write loop (a controller and another undoing each other's work).
func (f *Framework) NamespaceWrites(ctx context.Context, extra ...schema.GroupVersionResource) (string, error) {
	dyn, err := dynamic.NewForConfig(f.Config)
	if err != nil {
		return "", err
	}
	claims, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing claims: %w", err)
	}
	events, err := f.Client.CoreV1().Events(f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing events: %w", err)
	}
	var eventCount int32
	for _, ev := range events.Items {
		eventCount += max(ev.Count, 1)
		if ev.Series != nil {
			eventCount += ev.Series.Count
		}
	}
	out := fmt.Sprintf("%d Events (%d objects);", eventCount, len(events.Items))
	for _, gvr := range slices.Concat(layercacheGVRs, extra) {
		list, err := dyn.Resource(gvr).Namespace(f.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", fmt.Errorf("listing %s: %w", gvr.Resource, err)
		}
		for _, o := range list.Items {
			out += fmt.Sprintf(" %s %s rv %s;", o.GetKind(), o.GetName(), o.GetResourceVersion())
		}
	}
	for _, c := range claims.Items {
		out += fmt.Sprintf(" claim %s uid %s rv %s phase %s;", c.Name, c.UID, c.ResourceVersion, c.Status.Phase)
		if c.Spec.VolumeName == "" {
			continue
		}
		pv, err := f.Client.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("getting the PV of claim %s: %w", c.Name, err)
		}
		out += fmt.Sprintf(" PV %s rv %s phase %s;", pv.Name, pv.ResourceVersion, pv.Status.Phase)
	}
	return out, nil
}

// ExpectQuiet waits up to settle for the namespace to stop changing
// (Kubernetes' own components record their Events asynchronously; a
// namespace that never settles is a loop itself), then fails the test if
// anything NamespaceWrites sees changes within watch.
func (f *Framework) ExpectQuiet(ctx context.Context, settle, watch time.Duration, extra ...schema.GroupVersionResource) {
	f.t.Helper()
	var before string
	err := wait.PollUntilContextTimeout(ctx, 15*time.Second, settle, false, func(ctx context.Context) (bool, error) {
		now, err := f.NamespaceWrites(ctx, extra...)
		if err != nil {
			return false, err
		}
		settled := now == before
		before = now
		return settled, nil
	})
	if err != nil {
		f.t.Fatalf("namespace %s did not settle within %s: %v; last: %s", f.Namespace, settle, err, before)
	}
	f.t.Logf("watching namespace %s for %s: %s", f.Namespace, watch, before)
	deadline := time.Now().Add(watch)
	err = wait.PollUntilContextTimeout(ctx, 30*time.Second, watch+time.Minute, false, func(ctx context.Context) (bool, error) {
		now, err := f.NamespaceWrites(ctx, extra...)
		if err != nil {
			return false, err
		}
		if now != before {
			return false, fmt.Errorf("the namespace changed:\nbefore %s\nnow    %s", before, now)
		}
		return time.Now().After(deadline), nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
}
