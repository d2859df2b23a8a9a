package recipes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/template"

	"github.com/BurntSushi/toml"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// The recipes of docs/ci-recipes.md, read as their CI systems read them.
// These tests check that each parses strictly into the Kubernetes types it
// ends up as, and names a layercache cache with the policy the page says;
// the e2e test beside them has the API server dry-run the objects.

const dir = "../../docs/recipes"

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func strict(t *testing.T, what string, data []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// recipePods returns the pods each CI system would run, by recipe.
func recipePods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	pods := map[string]*corev1.Pod{}

	var jenkins corev1.Pod
	strict(t, "jenkins-pod.yaml", readFile(t, "jenkins-pod.yaml"), &jenkins)
	pods["jenkins"] = &jenkins

	// ARC: the chart's template is a pod template.
	var arc struct {
		GithubConfigURL    string                 `json:"githubConfigUrl"`
		GithubConfigSecret string                 `json:"githubConfigSecret"`
		Template           corev1.PodTemplateSpec `json:"template"`
	}
	strict(t, "arc-values.yaml", readFile(t, "arc-values.yaml"), &arc)
	pods["arc"] = &corev1.Pod{ObjectMeta: arc.Template.ObjectMeta, Spec: arc.Template.Spec}

	// GitLab: the runner patches its own job pod (containers build and
	// helper) with the pod_spec patch.
	var gitlab struct {
		Concurrent int `toml:"concurrent"`
		Runners    []struct {
			Name, URL, Executor string
			FeatureFlags        map[string]bool `toml:"feature_flags"`
			Kubernetes          struct {
				Namespace string
				PodSpec   []struct {
					Name      string
					PatchType string `toml:"patch_type"`
					Patch     string
				} `toml:"pod_spec"`
			}
		}
	}
	md, err := toml.Decode(string(readFile(t, "gitlab-config.toml")), &gitlab)
	if err != nil {
		t.Fatalf("gitlab-config.toml: %v", err)
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		t.Fatalf("gitlab-config.toml: keys this test does not know: %v", undecoded)
	}
	if len(gitlab.Runners) != 1 || len(gitlab.Runners[0].Kubernetes.PodSpec) != 1 || !gitlab.Runners[0].FeatureFlags["FF_USE_ADVANCED_POD_SPEC_CONFIGURATION"] {
		t.Fatalf("gitlab-config.toml: want one runner with one pod_spec patch and its feature flag: %+v", gitlab)
	}
	patch := gitlab.Runners[0].Kubernetes.PodSpec[0]
	if patch.PatchType != "strategic" {
		t.Fatalf("gitlab pod_spec patch_type %q, want strategic", patch.PatchType)
	}
	base := corev1.PodSpec{Containers: []corev1.Container{
		{Name: "build", Image: "maven:3-eclipse-temurin-21"},
		{Name: "helper", Image: "registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:x86_64-latest"},
	}}
	baseJSON, err := yaml.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	baseJSON, err = yaml.YAMLToJSON(baseJSON)
	if err != nil {
		t.Fatal(err)
	}
	patchJSON, err := yaml.YAMLToJSON([]byte(patch.Patch))
	if err != nil {
		t.Fatalf("gitlab pod_spec patch: %v", err)
	}
	merged, err := strategicpatch.StrategicMergePatch(baseJSON, patchJSON, corev1.PodSpec{})
	if err != nil {
		t.Fatalf("gitlab pod_spec patch does not apply: %v", err)
	}
	var spec corev1.PodSpec
	strict(t, "the GitLab job pod", merged, &spec)
	pods["gitlab"] = &corev1.Pod{Spec: spec}
	return pods
}

func TestRecipesNameACacheOnMarker(t *testing.T) {
	for system, pod := range recipePods(t) {
		t.Run(system, func(t *testing.T) {
			var cache *corev1.PersistentVolumeClaimTemplate
			for _, v := range pod.Spec.Volumes {
				if v.Ephemeral != nil && v.Name == "cache" {
					cache = v.Ephemeral.VolumeClaimTemplate
				}
			}
			if cache == nil {
				t.Fatalf("no generic ephemeral volume named cache in %+v", pod.Spec.Volumes)
			}
			ann := cache.Annotations
			if ann[v1alpha1.AnnotationCache] == "" || ann[v1alpha1.AnnotationCommit] != string(v1alpha1.CommitOnMarker) {
				t.Errorf("cache claim annotations %v, want a cache and commit %s (the pod's end says nothing of the job)", ann, v1alpha1.CommitOnMarker)
			}
			if sc := cache.Spec.StorageClassName; sc == nil || *sc != v1alpha1.StorageClassName {
				t.Errorf("cache claim class %v, want %s", sc, v1alpha1.StorageClassName)
			}
			mounted := false
			for _, c := range pod.Spec.Containers {
				for _, m := range c.VolumeMounts {
					mounted = mounted || m.Name == "cache"
				}
			}
			if !mounted {
				t.Errorf("no container mounts the cache volume")
			}
		})
	}
}

func TestRecipeStorageClass(t *testing.T) {
	var sc storagev1.StorageClass
	strict(t, "storageclass-by-pod-label.yaml", readFile(t, "storageclass-by-pod-label.yaml"), &sc)
	if sc.Provisioner != v1alpha1.ProvisionerName || sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("StorageClass %+v: want provisioner %s and WaitForFirstConsumer", sc, v1alpha1.ProvisionerName)
	}
	if !strings.Contains(sc.Parameters["cache"], ".Pod.Labels.app") {
		t.Errorf("cache parameter %q, want the template the page explains", sc.Parameters["cache"])
	}
}

// TestRecipeBranchStorageClass: the branch class names each branch's cache
// after the pod's label, as GitLab sets it from CI_COMMIT_REF_SLUG, and
// falls back to main; main's builds name main, whose fallback the agent
// skips. The templates are evaluated as the node agent does; a pod
// without the label names no valid cache, which the agent refuses with
// CacheTemplateFailed.
func TestRecipeBranchStorageClass(t *testing.T) {
	var sc storagev1.StorageClass
	strict(t, "storageclass-branch.yaml", readFile(t, "storageclass-branch.yaml"), &sc)
	if sc.Provisioner != v1alpha1.ProvisionerName || sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("StorageClass %+v: want provisioner %s and WaitForFirstConsumer", sc, v1alpha1.ProvisionerName)
	}
	type object struct{ Labels map[string]string }
	eval := func(param string, labels map[string]string) (string, error) {
		tmpl, err := template.New(param).Option("missingkey=error").Parse(sc.Parameters[param])
		if err != nil {
			t.Fatalf("parameter %s: %v", param, err)
		}
		var b strings.Builder
		err = tmpl.Execute(&b, struct {
			Namespace string
			Pod       object
		}{"gitlab-builds", object{labels}})
		return b.String(), err
	}
	for _, slug := range []string{"main", "feature-login-page", "42-fix-the-build"} {
		labels := map[string]string{"layercache-branch": slug}
		cache, err := eval("cache", labels)
		if err != nil || cache != slug || layerfs.ValidateName("cache", cache) != nil {
			t.Errorf("branch %s: cache %q, %v; want the slug as a valid cache name", slug, cache, err)
		}
		if fallback, err := eval("fallback", labels); err != nil || fallback != "main" {
			t.Errorf("branch %s: fallback %q, %v; want main", slug, fallback, err)
		}
	}
	if cache, err := eval("cache", map[string]string{}); err == nil && layerfs.ValidateName("cache", cache) == nil {
		t.Errorf("a pod without the label names cache %q; want no valid name", cache)
	}
}
