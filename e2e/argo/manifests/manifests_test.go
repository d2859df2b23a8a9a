package manifests

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/e2e/yamlobj"
)

// A miniature of Argo's manifests/: the shapes the transform touches, as
// upstream writes them. Files not listed here get a bare object of a kind
// their name implies.
var fixture = map[string]string{
	"cluster-install-no-crds/workflow-controller-rbac/workflow-controller-clusterrolebinding.yaml": `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: argo-binding
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: argo-cluster-role}
subjects:
- kind: ServiceAccount
  name: argo
  namespace: argo
`,
	"cluster-install-no-crds/workflow-controller-rbac/workflow-controller-rolebinding.yaml": `
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: argo-binding
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: argo-role}
subjects:
- kind: ServiceAccount
  name: argo
`,
	"base/workflow-controller/workflow-controller-configmap.yaml": `
apiVersion: v1
kind: ConfigMap
metadata:
  name: workflow-controller-configmap
`,
	"base/workflow-controller/workflow-controller-deployment.yaml": `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: workflow-controller
spec:
  template:
    spec:
      serviceAccountName: argo
      containers:
        - name: workflow-controller
          image: quay.io/argoproj/workflow-controller:latest
          command: [workflow-controller]
          args: [ ]
          env:
            - name: LEADER_ELECTION_IDENTITY
              valueFrom: {fieldRef: {apiVersion: v1, fieldPath: metadata.name}}
          ports:
            - {name: metrics, containerPort: 9090}
            - containerPort: 6060
      securityContext:
        runAsNonRoot: true
`,
	"quick-start/base/executor/emissary/executor-role.yaml": `
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: executor
rules:
  - apiGroups: [argoproj.io]
    resources: [workflowtaskresults]
    verbs: [create, patch]
`,
}

func writeFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, rel := range Files {
		content, ok := fixture[rel]
		if !ok {
			kind := "ClusterRole"
			switch {
			case strings.Contains(rel, "/crds/"):
				kind = "CustomResourceDefinition"
			case strings.HasSuffix(rel, "-sa.yaml"):
				kind = "ServiceAccount"
			case strings.HasSuffix(rel, "-priorityclass.yaml"):
				kind = "PriorityClass"
			case strings.HasSuffix(rel, "-role.yaml"):
				kind = "Role"
			}
			content = "kind: " + kind + "\nmetadata: {name: " + strings.TrimSuffix(filepath.Base(rel), ".yaml") + "}\n"
		}
		file := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func options(dir string) Options {
	return Options{
		ManifestsDir: dir, Version: "v3.7.3", Namespace: "argo", User: 8737,
		Image:       func(c string) string { return "localhost/argo-" + c + ":v3.7.3" },
		HostNetwork: true, APIServerHost: "127.0.0.1", APIServerPort: "6443",
	}
}

// render writes the manifests and decodes them back, keyed by kind/name.
func render(t *testing.T, o Options) (map[string]map[string]any, []string) {
	t.Helper()
	var out bytes.Buffer
	if err := Write(&out, o); err != nil {
		t.Fatal(err)
	}
	objs := map[string]map[string]any{}
	var order []string
	dec := utilyaml.NewYAMLOrJSONDecoder(&out, 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			break
		}
		key := obj["kind"].(string) + "/" + yamlobj.Name(obj)
		objs[key] = obj
		order = append(order, key)
	}
	return objs, order
}

func TestWriteHostNetwork(t *testing.T) {
	objs, order := render(t, options(writeFixture(t)))
	if order[0] != "Namespace/argo" {
		t.Errorf("first object %s, want Namespace/argo", order[0])
	}
	if ns := yamlobj.MapAt(objs["CustomResourceDefinition/argoproj.io_workflows"], "metadata")["namespace"]; ns != nil {
		t.Errorf("a CRD got namespace %v", ns)
	}
	if ns := yamlobj.MapAt(objs["ServiceAccount/workflow-controller-sa"], "metadata")["namespace"]; ns != "argo" {
		t.Errorf("ServiceAccount namespace %v, want argo", ns)
	}
	for _, key := range []string{"ClusterRoleBinding/argo-binding", "RoleBinding/argo-binding"} {
		if s := yamlobj.List(objs[key]["subjects"]); len(s) != 1 || s[0]["namespace"] != "argo" {
			t.Errorf("%s subjects %v, want the ServiceAccount in argo", key, s)
		}
	}
	exec, ok := objs["ClusterRole/"+ExecutorClusterRole]
	if !ok {
		t.Fatalf("no ClusterRole %s in %v", ExecutorClusterRole, order)
	}
	if _, ok := objs["Role/executor"]; ok {
		t.Error("the executor's Role is still there")
	}
	if ns := yamlobj.MapAt(exec, "metadata")["namespace"]; ns != nil {
		t.Errorf("ClusterRole %s got namespace %v", ExecutorClusterRole, ns)
	}

	data := yamlobj.MapAt(objs["ConfigMap/workflow-controller-configmap"], "data")
	var executor struct {
		Image           string `json:"image"`
		ImagePullPolicy string `json:"imagePullPolicy"`
		Env             []struct{ Name, Value string }
	}
	if err := yaml.Unmarshal([]byte(data["executor"].(string)), &executor); err != nil {
		t.Fatalf("executor config: %v: %q", err, data["executor"])
	}
	if executor.Image != "localhost/argo-argoexec:v3.7.3" || executor.ImagePullPolicy != "IfNotPresent" {
		t.Errorf("executor config %+v", executor)
	}
	if len(executor.Env) != 2 || executor.Env[0].Value != "127.0.0.1" || executor.Env[1].Value != "6443" {
		t.Errorf("executor env %+v, want the API server's host and port", executor.Env)
	}
	if got, want := strings.TrimSpace(data["workflowDefaults"].(string)), "spec:\n  hostNetwork: true"; got != want {
		t.Errorf("workflowDefaults %q, want %q", got, want)
	}

	d := objs["Deployment/workflow-controller"]
	pod := yamlobj.MapAt(d, "spec", "template", "spec")
	if pod["hostNetwork"] != true || yamlobj.MapAt(d, "spec", "strategy")["type"] != "Recreate" {
		t.Errorf("Deployment: hostNetwork %v, strategy %v", pod["hostNetwork"], yamlobj.MapAt(d, "spec", "strategy"))
	}
	if sc := yamlobj.MapAt(pod, "securityContext"); sc["runAsUser"] != float64(8737) || sc["runAsNonRoot"] != true {
		t.Errorf("pod securityContext %v", sc)
	}
	c := yamlobj.List(pod["containers"])[0]
	if c["image"] != "localhost/argo-workflow-controller:v3.7.3" || c["imagePullPolicy"] != "Never" {
		t.Errorf("controller image %v, pull policy %v", c["image"], c["imagePullPolicy"])
	}
	if args, _ := c["args"].([]any); len(args) != 2 || args[0] != "--executor-image" || args[1] != "localhost/argo-argoexec:v3.7.3" {
		t.Errorf("controller args %v", c["args"])
	}
	env := map[string]any{}
	for _, v := range yamlobj.List(c["env"]) {
		env[v["name"].(string)] = v["value"]
	}
	if env["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("controller env %v", env)
	}
	if _, ok := env["LEADER_ELECTION_IDENTITY"]; !ok {
		t.Errorf("upstream's env was dropped: %v", env)
	}
}

func TestWritePodNetwork(t *testing.T) {
	o := options(writeFixture(t))
	o.HostNetwork = false
	objs, _ := render(t, o)
	pod := yamlobj.MapAt(objs["Deployment/workflow-controller"], "spec", "template", "spec")
	if pod["hostNetwork"] != nil {
		t.Errorf("hostNetwork %v without HostNetwork", pod["hostNetwork"])
	}
	if _, ok := yamlobj.MapAt(objs["ConfigMap/workflow-controller-configmap"], "data")["workflowDefaults"]; ok {
		t.Error("workflowDefaults without HostNetwork")
	}
}

func TestWriteRefuses(t *testing.T) {
	dir := writeFixture(t)
	other := filepath.Join(dir, "quick-start/base/executor/emissary/executor-role.yaml")
	if err := os.WriteFile(other, []byte("kind: Pod\nmetadata: {name: x}\nspec: {containers: [{image: quay.io/argoproj/argocli:latest}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(&bytes.Buffer{}, options(dir)); err == nil || !strings.Contains(err.Error(), "still names an image") {
		t.Errorf("an unresolved quay.io image: err = %v", err)
	}
	if err := Write(&bytes.Buffer{}, options(t.TempDir())); err == nil || !strings.Contains(err.Error(), "go mod download") {
		t.Errorf("an empty manifests directory: err = %v", err)
	}
	for _, mutate := range []func(*Options){
		func(o *Options) { o.ManifestsDir = "" },
		func(o *Options) { o.Version = "3.7.3" },
		func(o *Options) { o.Image = nil },
		func(o *Options) { o.Namespace = "" },
		func(o *Options) { o.User = 0 },
		func(o *Options) { o.APIServerPort = "" },
	} {
		o := options(dir)
		mutate(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", o)
		}
	}
}
