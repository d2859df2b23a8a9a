package volumes

import (
	"context"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

func TestClaimFallbacks(t *testing.T) {
	ref := func(ns, name string) layerfs.CacheRef { return layerfs.CacheRef{Namespace: ns, Name: name} }
	pod := ephemeralPod(buildPod, corev1.PodPending, false)
	pod.Labels = map[string]string{"base": "main"}
	tests := []struct {
		name        string
		fallback    *string           // the claim's annotation; nil for none
		params      map[string]string // the class's parameters
		pod         *corev1.Pod
		want        []layerfs.CacheRef
		wantIgnored bool
		wantErr     string
		reason      string
	}{
		{name: "none"},
		{name: "one of the claim's namespace", fallback: new("main"), want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "in order, spaces trimmed", fallback: new("main, trusted/go ,release"),
			want: []layerfs.CacheRef{ref("ci", "main"), ref("trusted", "go"), ref("ci", "release")}},
		{name: "the claim's own cache and repeats dropped", fallback: new("maven,main,ci/main,ci/maven"),
			want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "empty annotation: none", fallback: new("")},
		{name: "five", fallback: new("a,b,c,d,e"), want: []layerfs.CacheRef{ref("ci", "a"), ref("ci", "b"), ref("ci", "c"), ref("ci", "d"), ref("ci", "e")}},
		{name: "six", fallback: new("a,b,c,d,e,f"), reason: kit.ReasonInvalidAnnotation,
			wantErr: `annotation layercache.dev/fallback has value "a,b,c,d,e,f": it lists 6 caches; use a comma-separated list of at most 5 caches`},
		{name: "upper case", fallback: new("main,Main"), reason: kit.ReasonInvalidAnnotation,
			wantErr: `annotation layercache.dev/fallback has value "Main": the cache name "Main" is not valid (it contains upper-case letters)`},
		{name: "empty entry", fallback: new("main,,go"), reason: kit.ReasonInvalidAnnotation, wantErr: "it has an empty entry"},
		{name: "two slashes", fallback: new("a/b/c"), reason: kit.ReasonInvalidAnnotation, wantErr: "more than one '/'"},
		{name: "path traversal", fallback: new("../etc"), reason: kit.ReasonInvalidAnnotation, wantErr: `namespace name ".." is not valid`},
		{name: "class template", params: map[string]string{kit.ParamFallback: "{{ .Namespace }}/main"}, want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "class template from the pod", params: map[string]string{kit.ParamFallback: "{{ .Pod.Labels.base }},release"}, pod: pod,
			want: []layerfs.CacheRef{ref("ci", "main"), ref("ci", "release")}},
		{name: "the annotation wins", fallback: new("go"), params: map[string]string{kit.ParamFallback: "main"}, want: []layerfs.CacheRef{ref("ci", "go")}},
		{name: "class template fails", params: map[string]string{kit.ParamFallback: "{{ .Pod.Labels.base }}"}, reason: kit.ReasonCacheTemplate,
			wantErr: `parameter fallback "{{ .Pod.Labels.base }}" cannot list the fallbacks of this claim (the claim)`},
		{name: "class template lists an invalid cache", params: map[string]string{kit.ParamFallback: "Main"}, reason: kit.ReasonCacheTemplate,
			wantErr: `parameter fallback "Main" listed the fallbacks "Main" for this claim, which are not valid`},
		{name: "kept by a registry class", fallback: new("main"), params: map[string]string{kit.ParamRegistry: "reg.example/caches"}, want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "registry class template", params: map[string]string{kit.ParamRegistry: "reg.example/caches", kit.ParamFallback: "main"}, want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "ignored by a snapshot class", fallback: new("main"), params: map[string]string{kit.ParamLayout: "snapshot"}, wantIgnored: true},
		{name: "still validated by a registry class", fallback: new("Main"), params: map[string]string{kit.ParamRegistry: "reg.example/caches"},
			reason: kit.ReasonInvalidAnnotation, wantErr: "upper-case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			class, err := kit.ParseClass(testClass(tt.params))
			must(t, err)
			ann := map[string]string{v1alpha1.AnnotationCache: "maven"}
			if tt.fallback != nil {
				ann[v1alpha1.AnnotationFallback] = *tt.fallback
			}
			claim := testClaim("ci", ann)
			if tt.pod != nil {
				claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: tt.pod.Name, UID: tt.pod.UID, Controller: new(true)}}
			}
			if wantPod := class.FallbackTemplate != nil && tt.fallback == nil; class.NeedsPod(claim) != wantPod {
				t.Errorf("needsPod = %v, want %v", class.NeedsPod(claim), wantPod)
			}
			req, err := kit.ParseClaim(claim, class, tt.pod)
			checkClaimError(t, err, tt.wantErr, tt.reason)
			if tt.wantErr != "" {
				return
			}
			if !reflect.DeepEqual(req.Fallbacks, tt.want) || req.FallbackIgnored != tt.wantIgnored {
				t.Errorf("fallbacks %v (ignored %v), want %v (ignored %v)", req.Fallbacks, req.FallbackIgnored, tt.want, tt.wantIgnored)
			}
			if got := req.MountOptions().Fallbacks; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("mountOptions().Fallbacks = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFallbackRefusedByClass(t *testing.T) {
	for _, tt := range []struct {
		name    string
		params  map[string]string
		wantErr string
	}{
		{"with the snapshot layout", map[string]string{kit.ParamFallback: "main", kit.ParamLayout: "snapshot"},
			`StorageClass "layercache": parameter fallback is set, but caches of the snapshot layout cannot start from a fallback yet; remove fallback`},
		{"not a template", map[string]string{kit.ParamFallback: "{{ .Namespace "},
			`parameter fallback has value "{{ .Namespace ", which is not a valid Go template`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := kit.ParseClass(testClass(tt.params))
			checkClaimError(t, err, tt.wantErr, kit.ReasonInvalidStorageClass)
		})
	}
}

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

func TestProvisionFallbackIgnored(t *testing.T) {
	env := newTestEnv(t, nil)
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "pr-1", v1alpha1.AnnotationFallback: "main"},
		map[string]string{kit.ParamLayout: "snapshot"})
	pv, _, err := env.prov.Provision(context.Background(), opts)
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if got := env.store.MountOpts[opts.PVName].Fallbacks; got != nil {
		t.Errorf("mounted with fallbacks %v, want none", got)
	}
	if _, ok := pv.Annotations[v1alpha1.AnnotationSeededFrom]; ok {
		t.Errorf("PV says it was seeded: %v", pv.Annotations)
	}
	env.wantEvent(t, "Warning FallbackIgnored", "layercache.dev/fallback is ignored", "cannot start from a fallback yet")
	if evs := strings.Join(env.drainEvents(), "\n"); strings.Contains(evs, "Seeded") {
		t.Errorf("unexpected events: %s", evs)
	}
}
