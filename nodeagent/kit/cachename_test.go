package kit

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

func TestCacheTemplate(t *testing.T) {
	pod := kittest.EphemeralPod(kittest.BuildPod, corev1.PodPending, false)
	pod.Labels = map[string]string{"app": "runner", "Bad": "Upper"}
	pod.Annotations = map[string]string{"ci.example/project": "shop"}
	tests := []struct {
		name     string
		template string
		ann      map[string]string // claim annotations
		pod      *corev1.Pod       // owner; nil for a standalone claim
		want     string            // NAMESPACE/NAME
		wantErr  string
		reason   string
	}{
		{name: "pod label and volume", template: "{{ .Pod.Labels.app }}-{{ .Volume }}", pod: pod, want: "ci/runner-cache"},
		{name: "pod annotation", template: `{{ index .Pod.Annotations "ci.example/project" }}`, pod: pod, want: "ci/shop"},
		{name: "namespace and claim", template: "{{ .Namespace }}-{{ .Claim.Name }}", want: "ci/ci-build-7x2k-cache"},
		{name: "standalone claim: volume is the claim's name", template: "{{ .Volume }}", want: "ci/build-7x2k-cache"},
		{name: "the claim's annotation wins", template: "{{ .Pod.Labels.app }}", pod: pod,
			ann: map[string]string{v1alpha1.AnnotationCache: "maven"}, want: "ci/maven"},
		{name: "missing label", template: "{{ .Pod.Labels.team }}", pod: pod, reason: ReasonCacheTemplate,
			wantErr: `parameter cache "{{ .Pod.Labels.team }}" cannot name the cache of this claim (pod build-7x2k): template: cache:1:7: executing "cache" at <.Pod.Labels.team>: map has no entry for key "team"; give pod build-7x2k the label or annotation`},
		{name: "pod label on a standalone claim", template: "{{ .Pod.Labels.app }}", reason: ReasonCacheTemplate,
			wantErr: "cannot name the cache of this claim (the claim)"},
		{name: "invalid result", template: "{{ .Pod.Labels.Bad }}", pod: pod, reason: ReasonCacheTemplate,
			wantErr: `named the cache "Upper" for this claim, which is not valid`},
		{name: "empty result", template: "{{ .Claim.Labels.x }}", reason: ReasonCacheTemplate, wantErr: `map has no entry for key "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			class, err := ParseClass(kittest.Class(map[string]string{ParamCache: tt.template}))
			must(t, err)
			claim := kittest.Claim("ci", tt.ann)
			claim.Name = kittest.BuildPod + "-cache"
			if tt.pod != nil {
				claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: tt.pod.Name, UID: tt.pod.UID, Controller: new(true)}}
			}
			if needs := class.NeedsPod(claim); needs != (tt.ann == nil) {
				t.Errorf("needsPod = %v, want %v", needs, tt.ann == nil)
			}
			req, err := parseClaim(claim, class, tt.pod)
			checkClaimError(t, err, tt.wantErr, tt.reason)
			if tt.wantErr == "" && req.Cache.String() != tt.want {
				t.Errorf("cache %s, want %s", req.Cache, tt.want)
			}
		})
	}
}

func TestCacheTemplateRefusedByClass(t *testing.T) {
	_, err := ParseClass(kittest.Class(map[string]string{ParamCache: "{{ .Pod.Labels.app "}))
	checkClaimError(t, err, `parameter cache has value "{{ .Pod.Labels.app ", which is not a valid Go template`, ReasonInvalidStorageClass)
}
