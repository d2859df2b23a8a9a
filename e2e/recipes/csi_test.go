package recipes

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// The CSI inline volume recipes of docs/ci-recipes.md. Pods are parsed
// strictly, as the claim recipes are; the Tekton and Argo objects, whose
// Go types this module does not have, are read for the parts that are
// Kubernetes types (a workspace's csi source, a Workflow's volumes), and
// those parts strictly.

// csiAttributes are the volumeAttributes the node agent takes
// (nodeagent/kit/csiattrs.go); it refuses the mount of a volume with any other.
var csiAttributes = []string{"cache", "mode", "commit", "size", "fallback"}

// csiRecipe is a recipe's CSI cache volume and the commit policy its CI
// system needs.
type csiRecipe struct {
	pod    *corev1.Pod // nil for the Tekton and Argo objects
	source *corev1.CSIVolumeSource
	commit v1alpha1.CommitPolicy
}

// csiRecipePods returns the pods each CI system would run with a CSI cache
// volume, by recipe.
func csiRecipePods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	pods := map[string]*corev1.Pod{}

	var job batchv1.Job
	strict(t, "job-csi.yaml", readFile(t, "job-csi.yaml"), &job)
	pods["job-csi"] = &corev1.Pod{ObjectMeta: job.Spec.Template.ObjectMeta, Spec: job.Spec.Template.Spec}

	var jenkins corev1.Pod
	strict(t, "jenkins-pod-csi.yaml", readFile(t, "jenkins-pod-csi.yaml"), &jenkins)
	pods["jenkins-csi"] = &jenkins

	var arc struct {
		GithubConfigURL    string                 `json:"githubConfigUrl"`
		GithubConfigSecret string                 `json:"githubConfigSecret"`
		Template           corev1.PodTemplateSpec `json:"template"`
	}
	strict(t, "arc-values-csi.yaml", readFile(t, "arc-values-csi.yaml"), &arc)
	pods["arc-csi"] = &corev1.Pod{ObjectMeta: arc.Template.ObjectMeta, Spec: arc.Template.Spec}

	pods["gitlab-csi"] = gitlabCSIPod(t)
	return pods
}

// gitlabCSIPod is the runner's job pod as the executor builds it from
// config.toml's volumes.csi: the volume, mounted in the job's containers.
func gitlabCSIPod(t *testing.T) *corev1.Pod {
	t.Helper()
	var gitlab struct {
		Concurrent int `toml:"concurrent"`
		Runners    []struct {
			Name, URL, Executor string
			Kubernetes          struct {
				Namespace string
				Volumes   struct {
					CSI []struct {
						Name             string            `toml:"name"`
						MountPath        string            `toml:"mount_path"`
						Driver           string            `toml:"driver"`
						ReadOnly         bool              `toml:"read_only"`
						VolumeAttributes map[string]string `toml:"volume_attributes"`
					} `toml:"csi"`
				}
			}
		}
	}
	md, err := toml.Decode(string(readFile(t, "gitlab-config-csi.toml")), &gitlab)
	if err != nil {
		t.Fatalf("gitlab-config-csi.toml: %v", err)
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		t.Fatalf("gitlab-config-csi.toml: keys this test does not know: %v", undecoded)
	}
	if len(gitlab.Runners) != 1 || len(gitlab.Runners[0].Kubernetes.Volumes.CSI) != 1 {
		t.Fatalf("gitlab-config-csi.toml: want one runner with one csi volume: %+v", gitlab)
	}
	v := gitlab.Runners[0].Kubernetes.Volumes.CSI[0]
	mount := corev1.VolumeMount{Name: v.Name, MountPath: v.MountPath, ReadOnly: v.ReadOnly}
	return &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{
			{Name: "build", Image: "maven:3-eclipse-temurin-21", VolumeMounts: []corev1.VolumeMount{mount}},
			{Name: "helper", Image: "registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:x86_64-latest", VolumeMounts: []corev1.VolumeMount{mount}},
		},
		Volumes: []corev1.Volume{{Name: v.Name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: v.Driver, ReadOnly: &v.ReadOnly, VolumeAttributes: v.VolumeAttributes,
		}}}},
	}}
}

// csiRecipes returns every CSI recipe's cache volume.
func csiRecipes(t *testing.T) map[string]csiRecipe {
	t.Helper()
	want := map[string]v1alpha1.CommitPolicy{
		// Their pods end with the build's result.
		"job-csi": v1alpha1.CommitOnSuccess,
		// Their pods say nothing of the job (see TestRecipesNameACacheOnMarker).
		"jenkins-csi": v1alpha1.CommitOnMarker, "arc-csi": v1alpha1.CommitOnMarker, "gitlab-csi": v1alpha1.CommitOnMarker,
	}
	recipes := map[string]csiRecipe{}
	for system, pod := range csiRecipePods(t) {
		var src *corev1.CSIVolumeSource
		for _, v := range pod.Spec.Volumes {
			if v.Name == "cache" {
				src = v.CSI
			}
		}
		if src == nil {
			t.Fatalf("%s: no CSI volume named cache in %+v", system, pod.Spec.Volumes)
		}
		mounted := false
		for _, c := range pod.Spec.Containers {
			for _, m := range c.VolumeMounts {
				mounted = mounted || m.Name == "cache"
			}
		}
		if !mounted {
			t.Errorf("%s: no container mounts the cache volume", system)
		}
		recipes[system] = csiRecipe{pod: pod, source: src, commit: want[system]}
	}

	// Tekton: the TaskRun's workspace binding, declared by its task.
	var tekton struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Workspaces []struct {
				Name string          `json:"name"`
				CSI  json.RawMessage `json:"csi"`
			} `json:"workspaces"`
			TaskSpec struct {
				Workspaces []struct {
					Name string `json:"name"`
				} `json:"workspaces"`
			} `json:"taskSpec"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(readFile(t, "tekton-taskrun-csi.yaml"), &tekton); err != nil {
		t.Fatalf("tekton-taskrun-csi.yaml: %v", err)
	}
	if tekton.APIVersion != "tekton.dev/v1" || tekton.Kind != "TaskRun" || len(tekton.Spec.Workspaces) != 1 ||
		len(tekton.Spec.TaskSpec.Workspaces) != 1 || tekton.Spec.TaskSpec.Workspaces[0].Name != tekton.Spec.Workspaces[0].Name {
		t.Fatalf("tekton-taskrun-csi.yaml: want a tekton.dev/v1 TaskRun binding the one workspace its task declares: %+v", tekton)
	}
	var tektonCSI corev1.CSIVolumeSource
	strict(t, "tekton-taskrun-csi.yaml's csi workspace", tekton.Spec.Workspaces[0].CSI, &tektonCSI)
	recipes["tekton-csi"] = csiRecipe{source: &tektonCSI, commit: v1alpha1.CommitOnSuccess}

	// Argo: the Workflow's volumes, mounted by its template's container.
	var argo struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Volumes   []json.RawMessage `json:"volumes"`
			Templates []struct {
				Container struct {
					VolumeMounts []corev1.VolumeMount `json:"volumeMounts"`
				} `json:"container"`
			} `json:"templates"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(readFile(t, "argo-workflow-csi.yaml"), &argo); err != nil {
		t.Fatalf("argo-workflow-csi.yaml: %v", err)
	}
	if argo.APIVersion != "argoproj.io/v1alpha1" || argo.Kind != "Workflow" || len(argo.Spec.Volumes) != 1 || len(argo.Spec.Templates) != 1 {
		t.Fatalf("argo-workflow-csi.yaml: want an argoproj.io/v1alpha1 Workflow with one volume and one template: %+v", argo)
	}
	var argoVolume corev1.Volume
	strict(t, "argo-workflow-csi.yaml's volume", argo.Spec.Volumes[0], &argoVolume)
	if argoVolume.Name != "cache" || argoVolume.CSI == nil {
		t.Fatalf("argo-workflow-csi.yaml: volume %+v, want a CSI volume named cache", argoVolume)
	}
	if !slices.ContainsFunc(argo.Spec.Templates[0].Container.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "cache" }) {
		t.Errorf("argo-workflow-csi.yaml: the template's container does not mount the cache volume")
	}
	recipes["argo-csi"] = csiRecipe{source: argoVolume.CSI, commit: v1alpha1.CommitOnSuccess}
	return recipes
}

// TestCSIRecipes checks each CSI recipe's volume as the node agent reads
// it: the driver, only the attributes the agent takes, a valid cache name,
// valid values, and the commit policy the page gives its CI system.
func TestCSIRecipes(t *testing.T) {
	recipes := csiRecipes(t)
	for _, system := range []string{"job-csi", "jenkins-csi", "arc-csi", "gitlab-csi", "tekton-csi", "argo-csi"} {
		if _, ok := recipes[system]; !ok {
			t.Errorf("no %s recipe", system)
		}
	}
	for system, r := range recipes {
		t.Run(system, func(t *testing.T) {
			src := r.source
			if src.Driver != v1alpha1.CSIDriverName {
				t.Errorf("driver %q, want %s", src.Driver, v1alpha1.CSIDriverName)
			}
			if src.ReadOnly != nil && *src.ReadOnly {
				t.Errorf("readOnly: true makes a read view, never committed; the recipe's build writes the cache")
			}
			attrs := src.VolumeAttributes
			for k := range attrs {
				if !slices.Contains(csiAttributes, k) {
					t.Errorf("attribute %q: the node agent refuses it; valid: %v", k, csiAttributes)
				}
			}
			if err := validCacheRef(attrs["cache"]); err != nil {
				t.Errorf("attribute cache %q: %v", attrs["cache"], err)
			}
			if v, ok := attrs["mode"]; ok {
				if mode, err := v1alpha1.ParseMode(v); err != nil || mode != v1alpha1.ModeWrite {
					t.Errorf("attribute mode %q, %v; the recipe's build writes the cache", v, err)
				}
			}
			commit := v1alpha1.CommitOnSuccess
			if v, ok := attrs["commit"]; ok {
				var err error
				if commit, err = v1alpha1.ParseCommitPolicy(v); err != nil {
					t.Errorf("attribute commit: %v", err)
				}
			}
			if commit != r.commit {
				t.Errorf("commit policy %s, want %s", commit, r.commit)
			}
			if v, ok := attrs["size"]; ok {
				if q, err := resource.ParseQuantity(v); err != nil || q.Sign() <= 0 {
					t.Errorf("attribute size %q, %v; want a positive quantity", v, err)
				}
			}
			if v, ok := attrs["fallback"]; ok {
				for _, f := range strings.Split(v, ",") {
					if err := validCacheRef(strings.TrimSpace(f)); err != nil {
						t.Errorf("attribute fallback %q: %v", v, err)
					}
				}
			}
		})
	}
}

// validCacheRef checks NAME or NAMESPACE/NAME.
func validCacheRef(v string) error {
	if ns, name, ok := strings.Cut(v, "/"); ok {
		if err := layerfs.ValidateName("namespace", ns); err != nil {
			return err
		}
		return layerfs.ValidateName("cache", name)
	}
	return layerfs.ValidateName("cache", v)
}
