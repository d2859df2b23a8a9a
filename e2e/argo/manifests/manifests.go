// Package manifests turns the install manifests of Argo Workflows (the
// manifests/ directory of its Go module, which upstream's kustomizations
// turn into install.yaml) into the manifests of the local e2e cluster: the
// workflow controller with its CRDs, ConfigMap and RBAC, in its own
// namespace, without the argo-server (UI and API: nothing here uses it).
// The quay.io image references become the images e2e/cluster/argo.sh built
// and imported, and, on the local cluster's network, the controller and
// the workflow pods run on the host network where the API server listens
// (see Options.HostNetwork).
//
// Nothing is hand-copied: a new Argo release changes the output through
// its own manifests/, and an image reference left unresolved is an error.
// The executor's Role, which upstream ships in its quick start for users
// to bind in their namespaces, becomes a ClusterRole of the same rules, so
// a namespace binds it with one RoleBinding.
package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/e2e/yamlobj"
)

// upstreamImagePrefix starts the image references of the release's
// manifests (quay.io/argoproj/workflow-controller:latest).
const upstreamImagePrefix = "quay.io/argoproj/"

// Upstream's names.
const (
	controllerDeployment = "workflow-controller"
	controllerConfigMap  = "workflow-controller-configmap"
	executorRole         = "executor"
)

// ExecutorClusterRole is the ClusterRole holding the executor's rules (the
// quick start's Role executor): a workflow's ServiceAccount needs it,
// bound in the workflow's namespace.
const ExecutorClusterRole = "argo-executor"

// Files are the release's manifests under manifests/ that make a cluster
// install of the controller alone, in the order they are applied: CRDs
// (minimal: upstream's install.yaml uses these; the full schemas exceed
// the size of an annotation for client-side apply), then what
// cluster-install-no-crds holds but the argo-server and its RBAC, then
// the executor's Role from the quick start.
var Files = []string{
	"base/crds/minimal/argoproj.io_clusterworkflowtemplates.yaml",
	"base/crds/minimal/argoproj.io_cronworkflows.yaml",
	"base/crds/minimal/argoproj.io_workflowartifactgctasks.yaml",
	"base/crds/minimal/argoproj.io_workfloweventbindings.yaml",
	"base/crds/minimal/argoproj.io_workflows.yaml",
	"base/crds/minimal/argoproj.io_workflowtaskresults.yaml",
	"base/crds/minimal/argoproj.io_workflowtasksets.yaml",
	"base/crds/minimal/argoproj.io_workflowtemplates.yaml",
	"cluster-install-no-crds/workflow-controller-rbac/workflow-aggregate-roles.yaml",
	"cluster-install-no-crds/workflow-controller-rbac/workflow-controller-clusterrole.yaml",
	"cluster-install-no-crds/workflow-controller-rbac/workflow-controller-clusterrolebinding.yaml",
	"cluster-install-no-crds/workflow-controller-rbac/workflow-controller-role.yaml",
	"cluster-install-no-crds/workflow-controller-rbac/workflow-controller-rolebinding.yaml",
	"base/workflow-controller/workflow-controller-sa.yaml",
	"base/workflow-controller/workflow-controller-priorityclass.yaml",
	"base/workflow-controller/workflow-controller-configmap.yaml",
	"base/workflow-controller/workflow-controller-deployment.yaml",
	"quick-start/base/executor/emissary/executor-role.yaml",
}

// Options say what to make of the release's manifests.
type Options struct {
	// ManifestsDir is the manifests/ directory of the module
	// github.com/argoproj/argo-workflows/v3 at Version.
	ManifestsDir string
	// Version is the release, e.g. v3.7.3: the images' tag.
	Version string
	// Image maps a command's name (workflow-controller, argoexec) to its
	// image reference.
	Image func(command string) string
	// Namespace is where the controller runs (upstream's install: argo).
	Namespace string
	// User is the numeric user the controller runs as: upstream's image
	// says USER 8737, an image without a user database cannot.
	User int
	// HostNetwork runs the controller on the host network and makes
	// hostNetwork the default of every Workflow, with the executor told to
	// reach the API server at APIServerHost:APIServerPort, for a cluster
	// whose pods cannot reach a Service address (no kube-proxy) and whose
	// API server listens on the host's loopback only.
	HostNetwork                  bool
	APIServerHost, APIServerPort string
}

// Validate reports the first option that cannot work.
func (o Options) Validate() error {
	if o.ManifestsDir == "" {
		return errors.New("the manifests directory of github.com/argoproj/argo-workflows/v3 is required, e.g. $(go env GOMODCACHE)/github.com/argoproj/argo-workflows/v3@v3.7.3/manifests")
	}
	if !strings.HasPrefix(o.Version, "v") {
		return fmt.Errorf("version %q: want a release such as v3.7.3", o.Version)
	}
	if o.Image == nil {
		return errors.New("no image mapping: the controller and the executor need images")
	}
	if o.Namespace == "" {
		return errors.New("a namespace is required, e.g. argo")
	}
	if o.User <= 0 {
		return fmt.Errorf("user %d: the controller runs as a non-root numeric user, e.g. 8737", o.User)
	}
	if o.HostNetwork && (o.APIServerHost == "" || o.APIServerPort == "") {
		return errors.New("on the host network the API server's host and port are required")
	}
	return nil
}

// Write renders the manifests as one multi-document YAML stream: the
// namespace first, then Files.
func Write(w io.Writer, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	var out bytes.Buffer
	ns := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": o.Namespace}}
	if _, err := writeObject(&out, ns); err != nil {
		return err
	}
	for _, rel := range Files {
		file := filepath.Join(o.ManifestsDir, rel)
		objs, err := yamlobj.ReadFile(file)
		if err != nil {
			return fmt.Errorf("%w (is %s the manifests/ directory of github.com/argoproj/argo-workflows/v3? run `go mod download` in e2e/tools/argo)", err, o.ManifestsDir)
		}
		for _, obj := range objs {
			if err := o.transform(obj); err != nil {
				return fmt.Errorf("%s: %s %s: %w", file, obj["kind"], yamlobj.Name(obj), err)
			}
			data, err := writeObject(&out, obj)
			if err != nil {
				return err
			}
			if bytes.Contains(data, []byte(upstreamImagePrefix)) {
				return fmt.Errorf("%s: %s %s still names an image of %s after substitution; the release added an image reference this program does not know", file, obj["kind"], yamlobj.Name(obj), upstreamImagePrefix)
			}
		}
	}
	_, err := w.Write(out.Bytes())
	return err
}

// writeObject appends obj to out as a YAML document and returns it.
func writeObject(out *bytes.Buffer, obj map[string]any) ([]byte, error) {
	data, err := yaml.Marshal(obj)
	if err != nil {
		return nil, err
	}
	out.WriteString("---\n")
	out.Write(data)
	return data, nil
}

// clusterScoped are the kinds of Files that take no namespace.
var clusterScoped = map[string]bool{
	"CustomResourceDefinition": true, "ClusterRole": true, "ClusterRoleBinding": true, "PriorityClass": true, "Namespace": true,
}

func (o Options) transform(obj map[string]any) error {
	kind, _ := obj["kind"].(string)
	if !clusterScoped[kind] {
		yamlobj.MapAt(obj, "metadata")["namespace"] = o.Namespace
	}
	switch kind {
	case "ClusterRoleBinding", "RoleBinding":
		// As kustomize's namespace transformer does: the controller's
		// ServiceAccount lives in Namespace.
		for _, s := range yamlobj.List(obj["subjects"]) {
			if s["kind"] == "ServiceAccount" {
				s["namespace"] = o.Namespace
			}
		}
	case "Role":
		if yamlobj.Name(obj) == executorRole {
			obj["kind"] = "ClusterRole"
			meta := yamlobj.MapAt(obj, "metadata")
			meta["name"] = ExecutorClusterRole
			delete(meta, "namespace")
		}
	case "ConfigMap":
		if yamlobj.Name(obj) == controllerConfigMap {
			return o.configMap(obj)
		}
	case "Deployment":
		return o.deployment(obj)
	}
	return nil
}

// configMap sets the executor's image and, on the host network, its way
// to the API server and the Workflows' default of hostNetwork.
func (o Options) configMap(obj map[string]any) error {
	executor := map[string]any{
		"image":           o.Image("argoexec"),
		"imagePullPolicy": "IfNotPresent",
	}
	cfg := map[string]any{}
	if o.HostNetwork {
		// The wait container creates the step's WorkflowTaskResult through
		// the API server, which listens on the node's loopback only; a
		// container's own env wins over the Service variables the kubelet
		// injects (the ClusterIP, which nothing routes here).
		executor["env"] = []any{
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": o.APIServerHost},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": o.APIServerPort},
		}
		// The node's loopback is the pod's only with the host's network.
		cfg["workflowDefaults"] = map[string]any{"spec": map[string]any{"hostNetwork": true}}
	}
	cfg["executor"] = executor
	data, _ := obj["data"].(map[string]any)
	if data == nil {
		data = map[string]any{}
		obj["data"] = data
	}
	for k, v := range cfg {
		if _, ok := data[k]; ok {
			return fmt.Errorf("upstream now sets %s; merge it instead of replacing it", k)
		}
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		data[k] = string(b)
	}
	return nil
}

func (o Options) deployment(obj map[string]any) error {
	if yamlobj.Name(obj) != controllerDeployment {
		return fmt.Errorf("unknown Deployment %s: this program knows the workflow controller's", yamlobj.Name(obj))
	}
	pod := yamlobj.MapAt(obj, "spec", "template", "spec")
	if pod == nil {
		return errors.New("no pod template")
	}
	if sc := yamlobj.MapAt(pod, "securityContext"); sc != nil {
		sc["runAsUser"] = o.User
		sc["runAsGroup"] = o.User
	} else {
		pod["securityContext"] = map[string]any{"runAsNonRoot": true, "runAsUser": o.User, "runAsGroup": o.User}
	}
	var env []map[string]any
	if o.HostNetwork {
		// One controller at a time holds the host's ports (:6060 health,
		// :9090 metrics): replace the pod instead of rolling it.
		yamlobj.MapAt(obj, "spec")["strategy"] = map[string]any{"type": "Recreate"}
		pod["hostNetwork"] = true
		pod["dnsPolicy"] = "ClusterFirstWithHostNet"
		env = append(env,
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": o.APIServerHost},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": o.APIServerPort})
	}
	found := false
	for _, c := range yamlobj.List(pod["containers"]) {
		image, _ := c["image"].(string)
		command, ok := strings.CutPrefix(image, upstreamImagePrefix)
		if !ok {
			continue
		}
		command, _, _ = strings.Cut(command, ":")
		if command != controllerDeployment {
			return fmt.Errorf("container %s: image %s is not the workflow controller's", c["name"], image)
		}
		found = true
		c["image"] = o.Image(command)
		c["imagePullPolicy"] = "Never"
		// The executor's image for every workflow pod; the ConfigMap says
		// the same, this flag wins over it.
		args, _ := c["args"].([]any)
		c["args"] = append(args, "--executor-image", o.Image("argoexec"))
		if len(env) > 0 {
			c["env"] = yamlobj.MergeEnv(yamlobj.List(c["env"]), env)
		}
	}
	if !found {
		return fmt.Errorf("no container runs %sworkflow-controller", upstreamImagePrefix)
	}
	return nil
}
