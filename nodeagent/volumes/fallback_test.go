package volumes

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

func TestProvisionFallbackRefused(t *testing.T) {
	tests := []struct {
		name      string
		objs      []client.Object
		fallback  string
		wantEvent string
		contains  []string
	}{
		{name: "invalid", fallback: "main,Go",
			wantEvent: "Warning InvalidAnnotation", contains: []string{"layercache.dev/fallback", `"Go"`, "DNS-1123"}},
		{name: "another namespace without grant", fallback: "main,trusted/main", objs: []client.Object{cacheObject("trusted", "main", "other")},
			wantEvent: "Warning CacheAccessDenied", contains: []string{"fallback trusted/main", `does not grant namespace "ci"`, "spec.readers"}},
		{name: "another namespace without a Cache", fallback: "trusted/main",
			wantEvent: "Warning CacheAccessDenied", contains: []string{"fallback trusted/main", "does not exist", `namespace "trusted" must create Cache "main"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, nil, tt.objs...)
			opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "pr-1", v1alpha1.AnnotationFallback: tt.fallback}, nil)
			pv, state, err := env.prov.Provision(context.Background(), opts)
			if err == nil || pv != nil || state != controller.ProvisioningFinished {
				t.Fatalf("Provision = %v, %v, %v; want a final refusal", pv, state, err)
			}
			env.wantEvent(t, tt.wantEvent, tt.contains...)
			if env.store.Mounts != 0 {
				t.Errorf("a refused claim was mounted")
			}
		})
	}
}

func TestProvisionSeeded(t *testing.T) {
	trustedMain := layerfs.CacheRef{Namespace: "trusted", Name: "main"}
	gone := deletingCache("trusted", "old")
	gone.Spec.Readers = []string{"ci"}
	env := newTestEnv(t, nil, cacheObject("trusted", "main", "ci"), gone)
	env.store.Cache(trustedMain).Generation = 3
	env.store.Cache(trustedMain).Layers = []layerfs.LayerInfo{{ID: "m3"}, {ID: "m2"}, {ID: "m1"}}
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "pr-1", v1alpha1.AnnotationFallback: "trusted/old,main,trusted/main"}, nil)
	pv, _, err := env.prov.Provision(context.Background(), opts)
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	// The fallback being deleted goes; ci/main has no generation, so
	// trusted/main seeds the volume.
	mount := env.store.MountOpts[opts.PVName]
	if want := []layerfs.CacheRef{{Namespace: "ci", Name: "main"}, trustedMain}; !reflect.DeepEqual(mount.Fallbacks, want) || mount.ReadOnly {
		t.Errorf("mounted with fallbacks %v (read-only %v), want %v, writable", mount.Fallbacks, mount.ReadOnly, want)
	}
	if got := pv.Annotations[v1alpha1.AnnotationSeededFrom]; got != "trusted/main@3" {
		t.Errorf("PV annotation %s = %q, want trusted/main@3", v1alpha1.AnnotationSeededFrom, got)
	}
	env.wantEvent(t, "Normal SeededFromFallback", "starts from fallback trusted/main at generation 3", "never written")
	// A seeded volume starts warm: a hit from a fallback, not a miss.
	if hits, misses := metricValue(t, env.prov.metrics.Hits.WithLabelValues("ci", "pr-1", kit.HitFallback)),
		metricValue(t, env.prov.metrics.Misses.WithLabelValues("ci", "pr-1")); hits != 1 || misses != 0 {
		t.Errorf("fallback hits = %v, misses = %v; want 1, 0", hits, misses)
	}

	// Seeding never writes the fallback: the commit creates ci/pr-1.
	res, err := env.store.Commit(context.Background(), opts.PVName)
	if err != nil || res.SeededFrom == nil || res.Cache.Name != "pr-1" {
		t.Fatalf("Commit = %+v, %v; want ci/pr-1 created seeded", res, err)
	}
	if info, _ := env.store.Inspect(context.Background(), trustedMain); info.Generation != 3 || len(info.Layers) != 3 {
		t.Errorf("the fallback changed: %+v", info)
	}
}

// A snapshot class's claim names its fallbacks to the store, which
// seeds the cache from a snapshot of the first with a generation.
func TestProvisionSnapshotClassPassesFallbacks(t *testing.T) {
	env := newTestEnv(t, nil)
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "pr-1", v1alpha1.AnnotationFallback: "main"},
		map[string]string{kit.ParamLayout: "snapshot"})
	if _, _, err := env.prov.Provision(context.Background(), opts); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	got := env.store.MountOpts[opts.PVName]
	if want := []layerfs.CacheRef{{Namespace: "ci", Name: "main"}}; !reflect.DeepEqual(got.Fallbacks, want) || got.Layout != layerfs.LayoutSnapshot {
		t.Errorf("mounted with fallbacks %v, layout %q; want %v, snapshot", got.Fallbacks, got.Layout, want)
	}
	if evs := strings.Join(env.drainEvents(), "\n"); strings.Contains(evs, "FallbackIgnored") {
		t.Errorf("unexpected events: %s", evs)
	}
}
