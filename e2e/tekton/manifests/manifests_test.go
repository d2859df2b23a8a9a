package manifests

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/layercache/layercache/e2e/yamlobj"
)

// A miniature of Tekton's config/: the shapes the transform touches, as
// upstream writes them.
var fixture = map[string]string{
	"100-namespace/100-namespace.yaml": `
apiVersion: v1
kind: Namespace
metadata:
  name: tekton-pipelines
  labels:
    pod-security.kubernetes.io/enforce: restricted
`,
	"300-crds/300-task.yaml": `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: tasks.tekton.dev
spec:
  conversion:
    strategy: Webhook
    webhook:
      clientConfig:
        service: {name: tekton-pipelines-webhook, namespace: tekton-pipelines}
`,
	"500-webhooks.yaml": `
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validation.webhook.pipeline.tekton.dev
webhooks:
- name: validation.webhook.pipeline.tekton.dev
  clientConfig:
    service: {name: tekton-pipelines-webhook, namespace: tekton-pipelines}
`,
	"config-info.yaml": `
apiVersion: v1
kind: ConfigMap
metadata:
  name: pipelines-info
  namespace: tekton-pipelines
data:
  version: "devel"
`,
	"controller.yaml": `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: tekton-pipelines-controller
  labels: {app.kubernetes.io/version: "devel"}
spec:
  template:
    spec:
      containers:
      - name: tekton-pipelines-controller
        image: ko://github.com/tektoncd/pipeline/cmd/controller
        args: ["-entrypoint-image", "ko://github.com/tektoncd/pipeline/cmd/entrypoint",
               "-shell-image", "cgr.dev/chainguard/busybox@sha256:19f0"]
        env: [{name: PROBES_PORT, value: "8080"}]
        ports: [{name: metrics, containerPort: 9090}, {name: probes, containerPort: 8080}]
`,
	"webhook.yaml": `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: tekton-pipelines-webhook
spec:
  template:
    spec:
      containers:
      - name: webhook
        image: ko://github.com/tektoncd/pipeline/cmd/webhook
        ports: [{name: https-webhook, containerPort: 8443}]
---
apiVersion: v1
kind: Service
metadata:
  name: tekton-pipelines-webhook
spec:
  selector: {app.kubernetes.io/name: webhook}
  ports: [{name: https-webhook, port: 443, targetPort: https-webhook}]
`,
	"events.yaml":      "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: tekton-events-controller}\n",
	"webhook-hpa.yaml": "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: tekton-pipelines-webhook}\n",
}

func writeFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range fixture {
		file := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func localOptions(dir string) Options {
	return Options{
		ConfigDir:     dir,
		Version:       "v1.6.0",
		Image:         func(c string) string { return "localhost/tekton-" + c + ":v1.6.0" },
		ShellImage:    "localhost/busybox:e2e",
		PullPolicy:    "Never",
		HostNetwork:   true,
		APIServerHost: "127.0.0.1",
		APIServerPort: "6443",
		WebhookHost:   "localhost",
		Ports:         LocalPorts,
	}
}

// render writes the manifests and indexes them by kind/name.
func render(t *testing.T, o Options) (string, map[string]map[string]any) {
	t.Helper()
	var out bytes.Buffer
	if err := Write(&out, o); err != nil {
		t.Fatal(err)
	}
	objs := map[string]map[string]any{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out.Bytes()), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			break
		}
		if obj != nil {
			objs[obj["kind"].(string)+"/"+yamlobj.Name(obj)] = obj
		}
	}
	return out.String(), objs
}

func TestWriteLocal(t *testing.T) {
	text, objs := render(t, localOptions(writeFixture(t)))
	if strings.Contains(text, "ko://") || strings.Contains(text, "devel") || strings.Contains(text, "chainguard") {
		t.Errorf("output still names ko://, devel or upstream's shell image:\n%s", text)
	}
	if _, ok := objs["Deployment/tekton-events-controller"]; ok {
		t.Error("events.yaml was applied; it is left out")
	}
	if got := yamlobj.MapAt(objs["Namespace/tekton-pipelines"], "metadata", "labels")[podSecurityEnforce]; got != "privileged" {
		t.Errorf("namespace enforces %v, want privileged (host-network pods)", got)
	}

	if st := yamlobj.MapAt(objs["Deployment/tekton-pipelines-webhook"], "spec", "strategy"); st["type"] != "Recreate" {
		t.Errorf("webhook Deployment strategy %v, want Recreate (host ports)", st)
	}
	ctrl := yamlobj.MapAt(objs["Deployment/tekton-pipelines-controller"], "spec", "template", "spec")
	if ctrl["hostNetwork"] != true {
		t.Error("controller is not on the host network")
	}
	c := yamlobj.List(ctrl["containers"])[0]
	if c["image"] != "localhost/tekton-controller:v1.6.0" || c["imagePullPolicy"] != "Never" {
		t.Errorf("controller image %v pull policy %v", c["image"], c["imagePullPolicy"])
	}
	args := c["args"].([]any)
	if args[1] != "localhost/tekton-entrypoint:v1.6.0" || args[3] != "localhost/busybox:e2e" {
		t.Errorf("controller args %v", args)
	}
	env := map[any]any{}
	for _, v := range yamlobj.List(c["env"]) {
		if _, dup := env[v["name"]]; dup {
			t.Errorf("env %v set twice", v["name"])
		}
		env[v["name"]] = v["value"]
	}
	if env["PROBES_PORT"] != "9580" || env["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || env["METRICS_PROMETHEUS_PORT"] != "9590" {
		t.Errorf("controller env %v", env)
	}
	for _, p := range yamlobj.List(c["ports"]) {
		if p["name"] == "probes" && p["containerPort"] != float64(9580) && p["containerPort"] != 9580 {
			t.Errorf("probes port %v, want 9580", p["containerPort"])
		}
	}

	svc := yamlobj.MapAt(objs["Service/tekton-pipelines-webhook"], "spec")
	if svc["type"] != "ExternalName" || svc["externalName"] != "localhost" || svc["selector"] != nil {
		t.Errorf("webhook Service %v, want an ExternalName of localhost", svc)
	}
	wh := yamlobj.List(objs["ValidatingWebhookConfiguration/validation.webhook.pipeline.tekton.dev"]["webhooks"])[0]
	if port := yamlobj.MapAt(wh, "clientConfig", "service")["port"]; port != float64(9443) && port != 9443 {
		t.Errorf("webhook service port %v, want 9443", port)
	}
	crd := yamlobj.MapAt(objs["CustomResourceDefinition/tasks.tekton.dev"], "spec", "conversion", "webhook", "clientConfig", "service")
	if port := crd["port"]; port != float64(9443) && port != 9443 {
		t.Errorf("conversion webhook port %v, want 9443", port)
	}
	if v := objs["ConfigMap/pipelines-info"]["data"].(map[string]any)["version"]; v != "v1.6.0" {
		t.Errorf("pipelines-info version %v", v)
	}
}

func TestWriteUpstreamNetwork(t *testing.T) {
	o := localOptions(writeFixture(t))
	o.HostNetwork = false
	_, objs := render(t, o)
	if yamlobj.MapAt(objs["Deployment/tekton-pipelines-controller"], "spec", "template", "spec")["hostNetwork"] != nil {
		t.Error("controller on the host network without HostNetwork")
	}
	if yamlobj.MapAt(objs["Service/tekton-pipelines-webhook"], "spec")["type"] != nil {
		t.Error("webhook Service changed without HostNetwork")
	}
}

func TestWriteRefusesUnknownImages(t *testing.T) {
	dir := writeFixture(t)
	extra := "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: x, image: ko://example.com/other}]\n"
	if err := os.WriteFile(filepath.Join(dir, "zz-extra.yaml"), []byte(extra), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Write(&bytes.Buffer{}, localOptions(dir))
	if err == nil || !strings.Contains(err.Error(), "ko://") {
		t.Errorf("Write with an unknown ko:// image: %v, want an error naming it", err)
	}
}

func TestValidate(t *testing.T) {
	o := localOptions("/nonexistent")
	o.Ports.WebhookProbes = o.Ports.ControllerProbes
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("Validate with a port given twice: %v", err)
	}
	o = localOptions("")
	if err := o.Validate(); err == nil {
		t.Error("Validate without a config directory passed")
	}
}
