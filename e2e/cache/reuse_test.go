//go:build e2e

package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestNextJobSeesCommittedFiles is the core promise: a build Job's pod
// writes into its cache volume and succeeds; the next Job naming the cache
// starts with those files; the Cache goes from generation 1 to 2, and
// `kubectl get caches` shows it.
func TestNextJobSeesCommittedFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "build"

	first := e.runJob(ctx, e.cacheJob("build-1", cacheAnnotations(cacheName),
		`set -e
		test -z "$(ls -A /cache)" || { echo "cache not empty:"; ls -la /cache; exit 1; }
		mkdir -p /cache/deps
		echo "module v1" > /cache/deps/module
		echo build-1 > /cache/builds.log`))
	end := e.expectVolumeEnd(ctx, first.Name, "Committed")
	checkPVAnnotations(t, end.PV, map[string]string{
		v1alpha1.AnnotationCache:          e.Namespace + "/" + cacheName,
		v1alpha1.AnnotationMode:           string(v1alpha1.ModeWrite),
		v1alpha1.AnnotationCommit:         string(v1alpha1.CommitOnSuccess),
		v1alpha1.AnnotationBaseGeneration: "0",
		v1alpha1.AnnotationNode:           e.Node.Name,
		v1alpha1.AnnotationPodOutcome:     v1alpha1.OutcomeSucceeded,
	})
	c := e.waitGeneration(ctx, cacheName, 1)
	if n := e.nodeEntry(c); n.Layers != 1 || n.SizeBytes <= 0 || n.LastUsed == nil {
		t.Errorf("replica after the first commit = %+v, want 1 layer, a size and a last use", *n)
	}
	if c.Status.NodeCount != 1 || c.Status.Size == "" || c.Status.LastUsed == nil {
		t.Errorf("derived status after the first commit = %s, want nodeCount 1, a size and a last use", statusString(c))
	}
	if !slices.Contains(c.Finalizers, v1alpha1.FinalizerCleanup) {
		t.Errorf("Cache finalizers = %v, want %s", c.Finalizers, v1alpha1.FinalizerCleanup)
	}

	second := e.runJob(ctx, e.cacheJob("build-2", cacheAnnotations(cacheName),
		`set -e
		cat /cache/deps/module /cache/builds.log
		echo build-2 >> /cache/builds.log`))
	if got, want := e.logs(ctx, second.Name), "module v1\nbuild-1\n"; got != want {
		t.Errorf("second Job's pod read %q from the cache, want %q (the first Job's files)", got, want)
	}
	end = e.expectVolumeEnd(ctx, second.Name, "Committed")
	if got := end.PV.Annotations[v1alpha1.AnnotationBaseGeneration]; got != "1" {
		t.Errorf("second volume's base generation = %q, want 1", got)
	}
	c = e.waitGeneration(ctx, cacheName, 2)
	if n := e.nodeEntry(c); n.LastWriter != e.Namespace+"/"+second.Name {
		t.Errorf("last writer = %q, want the second Job's pod %s/%s", n.LastWriter, e.Namespace, second.Name)
	}

	checkCacheTable(ctx, t, e, cacheName, map[string]string{"Generation": "2", "Nodes": "1", "Size": c.Status.Size})

	third := e.runPod(ctx, e.cachePod("reader", cacheAnnotations(cacheName), "cat /cache/builds.log"), corev1.PodSucceeded)
	if got, want := e.logs(ctx, third.Name), "build-1\nbuild-2\n"; got != want {
		t.Errorf("third pod read %q, want %q", got, want)
	}
}

func checkPVAnnotations(t *testing.T, pv *corev1.PersistentVolume, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := pv.Annotations[k]; got != v {
			t.Errorf("PV %s annotation %s = %q, want %q", pv.Name, k, got, v)
		}
	}
}

// checkCacheTable reads the namespace's Caches as `kubectl get caches`
// does (a server-side Table from the CRD's printer columns) and checks the
// row of cache.
func checkCacheTable(ctx context.Context, t *testing.T, e *env, cache string, want map[string]string) {
	t.Helper()
	raw, err := e.Client.CoreV1().RESTClient().Get().
		AbsPath("/apis", v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, "namespaces", e.Namespace, "caches").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		DoRaw(ctx)
	if err != nil {
		t.Fatalf("kubectl get caches (as a Table): %v", err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatalf("decoding the Cache table: %v", err)
	}
	var columns []string
	for _, c := range table.ColumnDefinitions {
		columns = append(columns, c.Name)
	}
	for _, c := range []string{"Name", "Generation", "Size", "Nodes", "Last Used", "Seeded From", "Age"} {
		if !slices.Contains(columns, c) {
			t.Errorf("kubectl get caches has columns %q, want %q among them", columns, c)
		}
	}
	for _, row := range table.Rows {
		if len(row.Cells) != len(columns) || fmt.Sprint(row.Cells[0]) != cache {
			continue
		}
		for i, c := range columns {
			cell := row.Cells[i]
			if f, ok := cell.(float64); ok { // JSON numbers
				cell = strconv.FormatInt(int64(f), 10)
			}
			if w, ok := want[c]; ok && fmt.Sprint(cell) != w {
				t.Errorf("kubectl get caches: %s of %s = %v, want %s", c, cache, cell, w)
			}
			if c == "Last Used" && fmt.Sprint(cell) == "<nil>" {
				t.Errorf("kubectl get caches: Last Used of %s is empty", cache)
			}
		}
		t.Logf("kubectl get caches: %q %v", columns, row.Cells)
		return
	}
	t.Errorf("kubectl get caches lists no row for %s: %v", cache, table.Rows)
}
