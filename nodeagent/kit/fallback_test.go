package kit

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

func TestClaimFallbacks(t *testing.T) {
	ref := func(ns, name string) layerfs.CacheRef { return layerfs.CacheRef{Namespace: ns, Name: name} }
	pod := kittest.EphemeralPod(kittest.BuildPod, corev1.PodPending, false)
	pod.Labels = map[string]string{"base": "main"}
	tests := []struct {
		name     string
		fallback *string           // the claim's annotation; nil for none
		params   map[string]string // the class's parameters
		pod      *corev1.Pod
		want     []layerfs.CacheRef
		wantErr  string
		reason   string
	}{
		{name: "none"},
		{name: "one of the claim's namespace", fallback: new("main"), want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "in order, spaces trimmed", fallback: new("main, trusted/go ,release"),
			want: []layerfs.CacheRef{ref("ci", "main"), ref("trusted", "go"), ref("ci", "release")}},
		{name: "the claim's own cache and repeats dropped", fallback: new("maven,main,ci/main,ci/maven"),
			want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "empty annotation: none", fallback: new("")},
		{name: "five", fallback: new("a,b,c,d,e"), want: []layerfs.CacheRef{ref("ci", "a"), ref("ci", "b"), ref("ci", "c"), ref("ci", "d"), ref("ci", "e")}},
		{name: "six", fallback: new("a,b,c,d,e,f"), reason: ReasonInvalidAnnotation,
			wantErr: `annotation layercache.dev/fallback has value "a,b,c,d,e,f": it lists 6 caches; use a comma-separated list of at most 5 caches`},
		{name: "upper case", fallback: new("main,Main"), reason: ReasonInvalidAnnotation,
			wantErr: `annotation layercache.dev/fallback has value "Main": the cache name "Main" is not valid (it contains upper-case letters)`},
		{name: "empty entry", fallback: new("main,,go"), reason: ReasonInvalidAnnotation, wantErr: "it has an empty entry"},
		{name: "two slashes", fallback: new("a/b/c"), reason: ReasonInvalidAnnotation, wantErr: "more than one '/'"},
		{name: "path traversal", fallback: new("../etc"), reason: ReasonInvalidAnnotation, wantErr: `namespace name ".." is not valid`},
		{name: "class template", params: map[string]string{ParamFallback: "{{ .Namespace }}/main"}, want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "class template from the pod", params: map[string]string{ParamFallback: "{{ .Pod.Labels.base }},release"}, pod: pod,
			want: []layerfs.CacheRef{ref("ci", "main"), ref("ci", "release")}},
		{name: "the annotation wins", fallback: new("go"), params: map[string]string{ParamFallback: "main"}, want: []layerfs.CacheRef{ref("ci", "go")}},
		{name: "class template fails", params: map[string]string{ParamFallback: "{{ .Pod.Labels.base }}"}, reason: ReasonCacheTemplate,
			wantErr: `parameter fallback "{{ .Pod.Labels.base }}" cannot list the fallbacks of this claim (the claim)`},
		{name: "class template lists an invalid cache", params: map[string]string{ParamFallback: "Main"}, reason: ReasonCacheTemplate,
			wantErr: `parameter fallback "Main" listed the fallbacks "Main" for this claim, which are not valid`},
		{name: "kept by a registry class", fallback: new("main"), params: map[string]string{ParamRegistry: "reg.example/caches"}, want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "registry class template", params: map[string]string{ParamRegistry: "reg.example/caches", ParamFallback: "main"}, want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "kept by a snapshot class", fallback: new("main"), params: map[string]string{ParamLayout: "snapshot"}, want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "snapshot class template", params: map[string]string{ParamLayout: "snapshot", ParamFallback: "main"}, want: []layerfs.CacheRef{ref("ci", "main")}},
		{name: "still validated by a registry class", fallback: new("Main"), params: map[string]string{ParamRegistry: "reg.example/caches"},
			reason: ReasonInvalidAnnotation, wantErr: "upper-case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			class, err := ParseClass(kittest.Class(tt.params))
			must(t, err)
			ann := map[string]string{v1alpha1.AnnotationCache: "maven"}
			if tt.fallback != nil {
				ann[v1alpha1.AnnotationFallback] = *tt.fallback
			}
			claim := kittest.Claim("ci", ann)
			if tt.pod != nil {
				claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: tt.pod.Name, UID: tt.pod.UID, Controller: new(true)}}
			}
			if wantPod := class.FallbackTemplate != nil && tt.fallback == nil; class.NeedsPod(claim) != wantPod {
				t.Errorf("needsPod = %v, want %v", class.NeedsPod(claim), wantPod)
			}
			req, err := parseClaim(claim, class, tt.pod)
			checkClaimError(t, err, tt.wantErr, tt.reason)
			if tt.wantErr != "" {
				return
			}
			if !reflect.DeepEqual(req.Fallbacks, tt.want) {
				t.Errorf("fallbacks %v, want %v", req.Fallbacks, tt.want)
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
		{"not a template", map[string]string{ParamFallback: "{{ .Namespace "},
			`parameter fallback has value "{{ .Namespace ", which is not a valid Go template`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseClass(kittest.Class(tt.params))
			checkClaimError(t, err, tt.wantErr, ReasonInvalidStorageClass)
		})
	}
}
