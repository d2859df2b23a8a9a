// Package manifests turns the release configuration of Tekton Pipelines
// (the config/ directory of its Go module, which `ko resolve` turns into
// release.yaml upstream) into the manifests of the local e2e cluster: the
// ko:// image references become the images e2e/cluster/tekton.sh built
// and imported, the version labels name the pinned release, and, on the
// local cluster's network, the controller and the webhook run on the host
// network where the API server can reach them (see Options.HostNetwork).
//
// Nothing is hand-copied: a new Tekton release changes the output through
// its own config/, and any ko:// reference left unresolved is an error.
package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/e2e/yamlobj"
)

// koPrefix starts the image references that `ko resolve` replaces.
const koPrefix = "ko://"

// cmdPrefix is the import path of Tekton's commands; ko://cmdPrefix+NAME is
// the image of command NAME.
const cmdPrefix = "github.com/tektoncd/pipeline/cmd/"

// Upstream's names of the two Deployments and the webhook's Service.
const (
	controllerDeployment = "tekton-pipelines-controller"
	webhookDeployment    = "tekton-pipelines-webhook"
	webhookService       = "tekton-pipelines-webhook"
)

// Ports are the ports the controller and the webhook listen on. On the
// host network they share the host's ports with every other host-network
// pod (layercache's own take 8080 to 8083), so each gets its own.
type Ports struct {
	ControllerProbes, ControllerMetrics, ControllerProfiling      int
	WebhookHTTPS, WebhookProbes, WebhookMetrics, WebhookProfiling int
}

// LocalPorts are the ports used on the local cluster's host network.
var LocalPorts = Ports{
	ControllerProbes: 9580, ControllerMetrics: 9590, ControllerProfiling: 9588,
	WebhookHTTPS: 9443, WebhookProbes: 9480, WebhookMetrics: 9490, WebhookProfiling: 9488,
}

// Options say what to make of the release configuration.
type Options struct {
	// ConfigDir is the config/ directory of the module
	// github.com/tektoncd/pipeline at Version.
	ConfigDir string
	// Version is the release, e.g. v1.6.0; it replaces "devel" in the
	// version labels and in the pipelines-info ConfigMap.
	Version string
	// Image maps a command's name (controller, entrypoint, ...) to its
	// image reference.
	Image func(command string) string
	// ShellImage runs the place-scripts init container of Task steps with
	// a script (sh with heredocs).
	ShellImage string
	// PullPolicy of the controller's and the webhook's containers, e.g.
	// Never for images imported into the nodes; empty keeps upstream's.
	PullPolicy string
	// HostNetwork runs the controller and the webhook on the host network
	// and makes the webhook's Service an ExternalName of WebhookHost, for a
	// cluster whose API server cannot reach pod or Service addresses (no
	// kube-proxy, no route to the pod network) and is itself reachable only
	// at APIServerHost:APIServerPort.
	HostNetwork                  bool
	APIServerHost, APIServerPort string
	WebhookHost                  string
	Ports                        Ports
}

// Validate reports the first option that cannot work.
func (o Options) Validate() error {
	if o.ConfigDir == "" {
		return errors.New("the config directory of github.com/tektoncd/pipeline is required, e.g. $(go env GOMODCACHE)/github.com/tektoncd/pipeline@v1.6.0/config")
	}
	if !strings.HasPrefix(o.Version, "v") {
		return fmt.Errorf("version %q: want a release such as v1.6.0", o.Version)
	}
	if o.Image == nil {
		return errors.New("no image mapping: every ko:// reference needs an image")
	}
	if o.ShellImage == "" {
		return errors.New("a shell image is required (busybox is enough): steps with a script need it")
	}
	if o.HostNetwork {
		if o.APIServerHost == "" || o.APIServerPort == "" || o.WebhookHost == "" {
			return errors.New("on the host network the API server's host and port and the webhook's host name are required")
		}
		p := o.Ports
		ports := []int{p.ControllerProbes, p.ControllerMetrics, p.ControllerProfiling, p.WebhookHTTPS, p.WebhookProbes, p.WebhookMetrics, p.WebhookProfiling}
		for i, port := range ports {
			if port <= 0 || port > 65535 {
				return fmt.Errorf("port %d is not a TCP port", port)
			}
			if slices.Contains(ports[:i], port) {
				return fmt.Errorf("port %d is given twice; on the host network every listener needs its own", port)
			}
		}
	}
	return nil
}

// Files lists the release's manifests under dir in the order upstream's
// release applies them (namespace, RBAC, CRDs, webhooks, config, then the
// Deployments). Left out: the remote resolvers (config/resolvers: they
// fetch Tasks from git, hubs and registries, which the cluster cannot
// reach), the events controller (events.yaml: CloudEvents, off by
// default) and the webhook's HorizontalPodAutoscaler (webhook-hpa.yaml:
// the cluster has no metrics server).
func Files(dir string) ([]string, error) {
	skip := map[string]bool{"events.yaml": true, "webhook-hpa.yaml": true}
	var files []string
	for _, pattern := range []string{"100-namespace/*.yaml", "*.yaml", "300-crds/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return nil, err
		}
		for _, f := range m {
			if !skip[filepath.Base(f)] {
				files = append(files, f)
			}
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no manifests in %s: is it the config/ directory of github.com/tektoncd/pipeline? (run `go mod download` in e2e/tools/tekton)", dir)
	}
	// Upstream's numeric prefixes order the kinds: 100 namespace, 200 RBAC,
	// 300 CRDs, 500 webhooks; the unnumbered config and Deployments last.
	slices.SortStableFunc(files, func(a, b string) int {
		return strings.Compare(sortKey(dir, a), sortKey(dir, b))
	})
	return files, nil
}

func sortKey(dir, file string) string {
	rel, _ := filepath.Rel(dir, file)
	if rel[0] >= '0' && rel[0] <= '9' {
		return rel
	}
	return "9" + rel
}

// Write renders the manifests as one multi-document YAML stream.
func Write(w io.Writer, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	files, err := Files(o.ConfigDir)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for _, file := range files {
		objs, err := yamlobj.ReadFile(file)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if err := o.transform(obj); err != nil {
				return fmt.Errorf("%s: %s %s: %w", file, obj["kind"], yamlobj.Name(obj), err)
			}
			data, err := yaml.Marshal(obj)
			if err != nil {
				return err
			}
			if bytes.Contains(data, []byte(koPrefix)) {
				return fmt.Errorf("%s: %s %s still names a ko:// image after substitution; the release added an image reference this program does not know", file, obj["kind"], yamlobj.Name(obj))
			}
			out.WriteString("---\n")
			out.Write(data)
		}
	}
	_, err = w.Write(out.Bytes())
	return err
}

func (o Options) transform(obj map[string]any) error {
	setVersion(obj, o.Version)
	kind, _ := obj["kind"].(string)
	switch {
	case kind == "ConfigMap" && yamlobj.Name(obj) == "pipelines-info":
		if data, ok := obj["data"].(map[string]any); ok && data["version"] == "devel" {
			data["version"] = o.Version
		}
	case kind == "Namespace" && o.HostNetwork:
		// Upstream enforces the restricted Pod Security level in its
		// namespace, which refuses host-network pods.
		if labels := yamlobj.MapAt(obj, "metadata", "labels"); labels != nil && labels[podSecurityEnforce] != nil {
			labels[podSecurityEnforce] = "privileged"
		}
	case kind == "Deployment":
		return o.deployment(obj)
	case kind == "Service" && yamlobj.Name(obj) == webhookService && o.HostNetwork:
		o.externalWebhookService(obj)
	case kind == "MutatingWebhookConfiguration" || kind == "ValidatingWebhookConfiguration":
		if o.HostNetwork {
			for _, wh := range yamlobj.List(obj["webhooks"]) {
				setServicePort(wh["clientConfig"], o.Ports.WebhookHTTPS)
			}
		}
	case kind == "CustomResourceDefinition":
		if o.HostNetwork {
			conv := yamlobj.MapAt(obj, "spec", "conversion", "webhook")
			if conv != nil {
				setServicePort(conv["clientConfig"], o.Ports.WebhookHTTPS)
			}
		}
	}
	return nil
}

const podSecurityEnforce = "pod-security.kubernetes.io/enforce"

// versionLabels hold "devel" in config/ and the release's tag in a release.
var versionLabels = []string{"app.kubernetes.io/version", "pipeline.tekton.dev/release", "version"}

// setVersion replaces "devel" in the version labels of obj and of its pod
// template.
func setVersion(obj map[string]any, version string) {
	for _, labels := range []map[string]any{
		yamlobj.MapAt(obj, "metadata", "labels"),
		yamlobj.MapAt(obj, "spec", "template", "metadata", "labels"),
	} {
		for _, k := range versionLabels {
			if labels != nil && labels[k] == "devel" {
				labels[k] = version
			}
		}
	}
}

func (o Options) deployment(obj map[string]any) error {
	pod := yamlobj.MapAt(obj, "spec", "template", "spec")
	if pod == nil {
		return errors.New("no pod template")
	}
	var ports map[string]int // container port name -> port
	var env []map[string]any
	switch yamlobj.Name(obj) {
	case controllerDeployment:
		p := o.Ports
		ports = map[string]int{"probes": p.ControllerProbes, "metrics": p.ControllerMetrics, "profiling": p.ControllerProfiling}
		env = []map[string]any{envVar("PROBES_PORT", p.ControllerProbes)}
	case webhookDeployment:
		p := o.Ports
		ports = map[string]int{"probes": p.WebhookProbes, "metrics": p.WebhookMetrics, "profiling": p.WebhookProfiling, "https-webhook": p.WebhookHTTPS}
		env = []map[string]any{envVar("PROBES_PORT", p.WebhookProbes), envVar("WEBHOOK_PORT", p.WebhookHTTPS)}
	default:
		return fmt.Errorf("unknown Deployment %s: this program knows the controller's and the webhook's", yamlobj.Name(obj))
	}
	if o.HostNetwork {
		// A rolling update's new pod would wait for the old one's host
		// ports, and the old one for the new one: replace the pod instead.
		yamlobj.MapAt(obj, "spec")["strategy"] = map[string]any{"type": "Recreate"}
		pod["hostNetwork"] = true
		pod["dnsPolicy"] = "ClusterFirstWithHostNet"
		env = append(env,
			envVar("METRICS_PROMETHEUS_PORT", ports["metrics"]),
			envVar("PROFILING_PORT", ports["profiling"]),
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": o.APIServerHost},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": o.APIServerPort})
	}
	for _, c := range yamlobj.List(pod["containers"]) {
		image, _ := c["image"].(string)
		ref, err := o.resolve(image)
		if err != nil {
			return err
		}
		c["image"] = ref
		if o.PullPolicy != "" {
			c["imagePullPolicy"] = o.PullPolicy
		}
		args, _ := c["args"].([]any)
		for i, a := range args {
			s, _ := a.(string)
			switch {
			case strings.HasPrefix(s, koPrefix):
				if args[i], err = o.resolve(s); err != nil {
					return err
				}
			case s == "-shell-image" && i+1 < len(args):
				args[i+1] = o.ShellImage
			}
		}
		if !o.HostNetwork {
			continue
		}
		// With hostNetwork, a container port is a host port: move each
		// listener to its own port, and say so where the program reads it.
		for _, p := range yamlobj.List(c["ports"]) {
			pname, _ := p["name"].(string)
			port, ok := ports[pname]
			if !ok {
				return fmt.Errorf("container %s: port %s has no host-network port assigned", c["name"], pname)
			}
			p["containerPort"] = port
		}
		c["env"] = yamlobj.MergeEnv(yamlobj.List(c["env"]), env)
	}
	return nil
}

// externalWebhookService turns the webhook's Service into an ExternalName
// of the host. The API server resolves a webhook's Service to its
// ClusterIP, which nothing routes here, but an ExternalName to that name:
// it dials WebhookHost at the webhook configuration's port, and still
// verifies the certificate for <service>.<namespace>.svc.
func (o Options) externalWebhookService(svc map[string]any) {
	spec := yamlobj.MapAt(svc, "spec")
	delete(spec, "selector")
	spec["type"] = "ExternalName"
	spec["externalName"] = o.WebhookHost
	spec["ports"] = []any{map[string]any{"name": "https-webhook", "port": o.Ports.WebhookHTTPS, "targetPort": o.Ports.WebhookHTTPS}}
}

// resolve maps ko://github.com/tektoncd/pipeline/cmd/NAME to NAME's image.
func (o Options) resolve(ref string) (string, error) {
	path, ok := strings.CutPrefix(ref, koPrefix)
	if !ok {
		return ref, nil
	}
	command, ok := strings.CutPrefix(path, cmdPrefix)
	if !ok || command == "" || strings.Contains(command, "/") {
		return "", fmt.Errorf("image %s is not one of Tekton's commands (%s...)", ref, koPrefix+cmdPrefix)
	}
	image := o.Image(command)
	if image == "" {
		return "", fmt.Errorf("no image for %s", ref)
	}
	return image, nil
}

func setServicePort(clientConfig any, port int) {
	cc, _ := clientConfig.(map[string]any)
	if svc, ok := cc["service"].(map[string]any); ok {
		svc["port"] = port
	}
}

func envVar(name string, port int) map[string]any {
	return map[string]any{"name": name, "value": strconv.Itoa(port)}
}
