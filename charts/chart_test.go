// Package charts holds the Helm chart charts/layercache; this test keeps it
// and the deploy package in config/ from drifting apart. It renders the
// chart with the helm binary (make test-unit builds it from
// hack/tools/helm into bin/helm) and compares the objects, as objects, with
// the kustomize build of the same package: the defaults with
// config/default, the e2e values with config/e2e. It also checks that every
// flag of the components and every StorageClass parameter is a value the
// schema knows, and that helm lint passes.
package charts

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/cachemanager"
	"github.com/layercache/layercache/nodeagent"
	"github.com/layercache/layercache/nodeagent/kit"
)

const (
	chartDir  = "layercache"
	namespace = "layercache-system"
	release   = "layercache"
	e2eValues = "layercache/ci/e2e-values.yaml"
)

// helmLabels are the labels Helm's conventions add to the chart's objects
// and the package's lack; the comparison leaves them out.
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart"}

// keepPolicy is the annotation that keeps the CRDs (and so every Cache)
// through helm upgrade and helm uninstall.
const keepPolicy = "helm.sh/resource-policy"

// helm runs the helm binary, $HELM or bin/helm, and returns its standard
// output; a missing binary fails the test with how to build it.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		bin = filepath.Join("..", "bin", "helm")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no helm binary at %s (%v): run `make bin/helm` (builds it from hack/tools/helm), or set HELM", bin, err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w: %s%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	return stdout.Bytes(), nil
}

// renderChart is `helm template` of the chart into namespace with extra
// arguments (-f, --set), decoded.
func renderChart(t *testing.T, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, slices.Concat([]string{"template", release, chartDir, "--namespace", namespace}, extra)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("helm template's output: %v", err)
	}
	return objs
}

func renderKustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return objs
}

// decode reads a stream of YAML documents into objects, through JSON, so
// that the chart's and kustomize's numbers and strings compare alike.
func decode(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading a document: %w", err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", doc, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", doc, err)
		}
		objs = append(objs, obj)
	}
}

func key(o *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
}

// comparable leaves out of the chart's object what only Helm adds: its
// labels, and the keep policy of the CRDs.
func comparable(o *unstructured.Unstructured) *unstructured.Unstructured {
	o = o.DeepCopy()
	labels := o.GetLabels()
	for _, l := range helmLabels {
		delete(labels, l)
	}
	if len(labels) == 0 {
		labels = nil // SetLabels(nil) removes the field, as the package has it
	}
	o.SetLabels(labels)
	annotations := o.GetAnnotations()
	delete(annotations, keepPolicy)
	if len(annotations) == 0 {
		annotations = nil
	}
	o.SetAnnotations(annotations)
	return o
}

// sortEnv orders each container's environment by name, in the chart's
// object and the package's: kustomize puts an overlay's variables before
// the base's, the chart after. The order matters only to a value that
// refers to another variable ($(NAME)), which fails the test instead.
func sortEnv(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	containers, found, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if err != nil || !found {
		return
	}
	for _, c := range containers {
		c := c.(map[string]any)
		env, _ := c["env"].([]any)
		for _, e := range env {
			if v, _ := e.(map[string]any)["value"].(string); strings.Contains(v, "$(") {
				t.Fatalf("%s: env value %q refers to a variable, so the order of the env matters and this test cannot sort it", key(o), v)
			}
		}
		slices.SortStableFunc(env, func(a, b any) int {
			return strings.Compare(a.(map[string]any)["name"].(string), b.(map[string]any)["name"].(string))
		})
	}
	if err := unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
}

// TestChartRendersThePackage: the chart's objects are the package's, field
// for field, with the default values and with the e2e cluster's. The one
// object the chart leaves out is the package's Namespace: Helm keeps a
// release in its namespace, which must exist before the release (docs/helm.md).
func TestChartRendersThePackage(t *testing.T) {
	for _, tc := range []struct {
		name, kustomization string
		helmArgs            []string
	}{
		{name: "default values as config/default", kustomization: "../config/default"},
		{name: "e2e values as config/e2e", kustomization: "../config/e2e", helmArgs: []string{"--values", e2eValues}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]*unstructured.Unstructured{}
			for _, o := range renderKustomize(t, tc.kustomization) {
				if o.GetKind() == "Namespace" {
					continue
				}
				sortEnv(t, o)
				want[key(o)] = o
			}
			got := map[string]*unstructured.Unstructured{}
			for _, o := range renderChart(t, tc.helmArgs...) {
				if _, dup := got[key(o)]; dup {
					t.Errorf("the chart renders %s twice", key(o))
				}
				got[key(o)] = o
			}
			for _, k := range slices.Sorted(maps.Keys(want)) {
				g, ok := got[k]
				if !ok {
					t.Errorf("the chart lacks %s, which %s has", k, tc.kustomization)
					continue
				}
				c := comparable(g)
				sortEnv(t, c)
				if !reflect.DeepEqual(c.Object, want[k].Object) {
					t.Errorf("%s differs:\n%s", k, diff(want[k].Object, c.Object))
				}
			}
			for _, k := range slices.Sorted(maps.Keys(got)) {
				if _, ok := want[k]; !ok {
					t.Errorf("the chart renders %s, which %s lacks", k, tc.kustomization)
				}
			}
		})
	}
}

// diff names the paths where the package's object (want) and the chart's
// (got) differ, with both values.
func diff(want, got any) string {
	var b strings.Builder
	var walk func(path string, w, g any)
	walk = func(path string, w, g any) {
		wm, wok := w.(map[string]any)
		gm, gok := g.(map[string]any)
		if wok && gok {
			for _, k := range slices.Sorted(maps.Keys(maps.Collect(func(yield func(string, bool) bool) {
				for k := range wm {
					yield(k, true)
				}
				for k := range gm {
					yield(k, true)
				}
			}))) {
				walk(path+"."+k, wm[k], gm[k])
			}
			return
		}
		wl, wok := w.([]any)
		gl, gok := g.([]any)
		if wok && gok && len(wl) == len(gl) {
			for i := range wl {
				walk(fmt.Sprintf("%s[%d]", path, i), wl[i], gl[i])
			}
			return
		}
		if !reflect.DeepEqual(w, g) {
			wy, _ := yaml.Marshal(w)
			gy, _ := yaml.Marshal(g)
			fmt.Fprintf(&b, "  %s:\n    package: %s\n    chart:   %s\n", path, indent(wy), indent(gy))
		}
	}
	walk("", want, got)
	return b.String()
}

// indent lines up a multi-line YAML value under its label.
func indent(y []byte) string {
	return strings.ReplaceAll(strings.TrimSuffix(string(y), "\n"), "\n", "\n             ")
}

// TestCRDsSurviveUpgradeAndUninstall: a CRD's deletion deletes every Cache,
// and the node agents then clear those caches from every node. The chart
// renders the CRDs as templates (so that helm upgrade updates them), each
// with helm.sh/resource-policy: keep, which Helm honours on upgrade and
// uninstall.
func TestCRDsSurviveUpgradeAndUninstall(t *testing.T) {
	var crds []string
	for _, o := range renderChart(t) {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		crds = append(crds, o.GetName())
		if got := o.GetAnnotations()[keepPolicy]; got != "keep" {
			t.Errorf("CRD %s: %s = %q, want keep", o.GetName(), keepPolicy, got)
		}
	}
	if want := []string{"cachereplicas.layercache.dev", "caches.layercache.dev"}; !slices.Equal(crds, want) {
		t.Errorf("the chart renders CRDs %q, want %q", crds, want)
	}
	if _, err := os.Stat(filepath.Join(chartDir, "crds")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the chart has a crds/ directory (%v): Helm never upgrades those, keep the CRDs in files/config", err)
	}
}

// TestMonitoringObjects: the chart renders config/monitoring's PodMonitors,
// PrometheusRule and dashboard only when asked, each as the package has
// it in the release's namespace, with monitoring.labels added (a
// Prometheus's selectors), and the dashboard as a ConfigMap that Grafana's
// sidecar finds.
func TestMonitoringObjects(t *testing.T) {
	for _, o := range renderChart(t) {
		if o.GetAPIVersion() == "monitoring.coreos.com/v1" || o.GetName() == "layercache-dashboard" {
			t.Errorf("default values render %s: monitoring objects are off unless enabled", key(o))
		}
	}
	const ns = "observability"
	var want []*unstructured.Unstructured
	for _, file := range []string{"podmonitors.yaml", "prometheusrule.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "config", "monitoring", file))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decode(bytes.ReplaceAll(data, []byte(namespace), []byte(ns)))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		want = append(want, objs...)
	}
	got := map[string]*unstructured.Unstructured{}
	for _, o := range renderChart(t, "--namespace", ns, "--set", "monitoring.podMonitors.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true,monitoring.labels.release=prometheus") {
		got[key(o)] = o
	}
	for _, w := range want {
		g, ok := got[key(w)]
		if !ok {
			t.Errorf("with monitoring enabled the chart renders no %s", key(w))
			continue
		}
		if l := g.GetLabels()["release"]; l != "prometheus" {
			t.Errorf("%s: label release = %q, want monitoring.labels' %q", key(g), l, "prometheus")
		}
		g = comparable(g)
		labels := g.GetLabels()
		delete(labels, "release")
		g.SetLabels(labels)
		if !reflect.DeepEqual(g.Object, w.Object) {
			t.Errorf("%s differs from config/monitoring's:\n chart: %s\n  want: %s", key(w), g.Object, w.Object)
		}
	}
	dash, ok := got["ConfigMap "+ns+"/layercache-dashboard"]
	if !ok {
		t.Fatal("with monitoring.dashboard.enabled the chart renders no ConfigMap layercache-dashboard")
	}
	if l := dash.GetLabels()["grafana_dashboard"]; l != "1" {
		t.Errorf("the dashboard's ConfigMap: label grafana_dashboard = %q, want \"1\" (Grafana's sidecar default)", l)
	}
	data, err := os.ReadFile(filepath.Join("..", "config", "monitoring", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedString(dash.Object, "data", "layercache.json"); strings.TrimSpace(got) != strings.TrimSpace(string(data)) {
		t.Errorf("the dashboard's ConfigMap does not hold config/monitoring/dashboard.json as it is (%d bytes, want %d)", len(got), len(data))
	}
}

// TestPreviousVersionIsPackaged: charts/testdata holds the chart's
// previous version, which the e2e upgrade test (TestHelmUpgradeKeepsCaches)
// installs before it upgrades to this one; a chart change moves the
// version, and the package moves with it.
func TestPreviousVersionIsPackaged(t *testing.T) {
	chartVersion := func(chart string) string {
		t.Helper()
		out, err := helm(t, "show", "chart", chart)
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Version string `json:"version"`
		}
		if err := yaml.Unmarshal(out, &c); err != nil {
			t.Fatalf("helm show chart %s: %v", chart, err)
		}
		return c.Version
	}
	packages, err := filepath.Glob(filepath.Join("testdata", "layercache-*.tgz"))
	if err != nil || len(packages) != 1 {
		t.Fatalf("charts/testdata holds %q (%v), want the previous version's package alone (helm package of it)", packages, err)
	}
	previous, current := chartVersion(packages[0]), chartVersion(chartDir)
	if filepath.Base(packages[0]) != "layercache-"+previous+".tgz" {
		t.Errorf("%s holds chart version %s", packages[0], previous)
	}
	if previous == current {
		t.Errorf("charts/testdata's package is version %s, the chart's own: it must be the previous version", previous)
	}
}

func TestLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"default values", nil},
		{"e2e values", []string{"--values", e2eValues}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out, err := helm(t, slices.Concat([]string{"lint", "--strict", chartDir, "--namespace", namespace}, tc.args)...); err != nil {
				t.Errorf("%v\n%s", err, out)
			}
		})
	}
}

// chartValue is where the chart takes one component flag: a values path and
// a value to set that differs from the default, as --set writes it and as
// the flag then reads.
type chartValue struct {
	path, set, arg string
}

// notValues are the flags the chart sets from the pod itself, not from a
// value, with the reason.
var notValues = map[string]string{
	"kubeconfig": "the components use their service account's in-cluster config",
	"node-name":  "the agent's node, from spec.nodeName",
	"namespace":  "the release's namespace, from metadata.namespace (POD_NAMESPACE)",
}

// camel turns a flag name into its value's name: gc-max-age -> gcMaxAge,
// leader-election-id -> leaderElectionId.
func camel(flag string) string {
	parts := strings.Split(flag, "-")
	for i := 1; i < len(parts); i++ {
		parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
	}
	return strings.Join(parts, "")
}

// testValue is a value of a flag's type that no default uses.
func testValue(flag, typ string) (string, error) {
	switch {
	case flag == "root" || flag == "kubelet-dir":
		return "/srv/" + flag, nil
	case strings.HasSuffix(flag, "bind-address"):
		return ":9999", nil
	case flag == "registry-compression":
		return "gzip", nil
	case flag == "mkfs-btrfs":
		return "/opt/bin/mkfs.btrfs", nil
	case flag == "leader-election-namespace":
		return "elsewhere", nil
	case flag == "leader-election-id":
		return "leader.example", nil
	case flag == "namespace-max-cache-size":
		return "77Gi", nil
	}
	switch typ {
	case "duration":
		return "77m", nil
	case "quantity":
		return "77Gi", nil
	case "int", "float64":
		return "7", nil
	case "bool":
		return "false", nil
	}
	return "", fmt.Errorf("flag --%s of type %s: no test value; add one", flag, typ)
}

// componentValues maps every flag of a component to the chart's value.
func componentValues(t *testing.T, component string, fs *pflag.FlagSet) map[string]chartValue {
	t.Helper()
	values := map[string]chartValue{}
	fs.VisitAll(func(f *pflag.Flag) {
		if _, ok := notValues[f.Name]; ok {
			return
		}
		path := component + "." + camel(f.Name)
		switch f.Name {
		case "root":
			path = "hostRoot"
		case "kubelet-dir":
			path = "kubeletDir"
		}
		v, err := testValue(f.Name, f.Value.Type())
		if err != nil {
			t.Fatal(err)
		}
		values[f.Name] = chartValue{path: path, set: v, arg: "--" + f.Name + "=" + v}
	})
	values["zap-log-level"] = chartValue{path: component + ".logLevel", set: "debug", arg: "--zap-log-level=debug"}
	return values
}

// TestEveryFlagIsAValue: each flag of `layercache node`, `lazyfs` and
// `manager` but those of notValues is a value of the chart: setting it
// puts the flag on the container's command line.
func TestEveryFlagIsAValue(t *testing.T) {
	nodeFlags := pflag.NewFlagSet("node", pflag.ContinueOnError)
	nodeOpts := nodeagent.DefaultOptions()
	nodeOpts.AddFlags(nodeFlags)
	managerFlags := pflag.NewFlagSet("manager", pflag.ContinueOnError)
	managerOpts := cachemanager.DefaultOptions()
	managerOpts.AddFlags(managerFlags)
	// `layercache lazyfs`'s flags are defined in a main package
	// (cmd/layercache/lazyfs.go), which a test cannot import; these follow
	// docs/reference.md's table of them, which cmd/layercache's docs test
	// keeps current.
	lazyfs := pflag.NewFlagSet("lazyfs", pflag.ContinueOnError)
	lazyfs.String("root", "", "")
	lazyfs.Duration("agent-wait", 0, "")

	for _, tc := range []struct {
		component, workload, container string
		flags                          map[string]chartValue
	}{
		{"node", "DaemonSet", "node", componentValues(t, "node", nodeFlags)},
		{"lazyfs", "DaemonSet", "lazyfs", componentValues(t, "lazyfs", lazyfs)},
		{"manager", "Deployment", "manager", componentValues(t, "manager", managerFlags)},
	} {
		for _, flag := range slices.Sorted(maps.Keys(tc.flags)) {
			v := tc.flags[flag]
			if tc.component == "lazyfs" && flag == "zap-log-level" {
				// The lazyfs container logs as the agent does.
				v.path = "node.logLevel"
			}
			t.Run(tc.component+"/"+flag, func(t *testing.T) {
				t.Parallel() // each case is one helm process
				args := containerArgs(t, renderChart(t, "--set", v.path+"="+v.set), tc.workload, tc.container)
				switch flag {
				case "lazyfs-sidecar":
					// false drops the flag (its default) and the lazyfs container.
					if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--lazyfs-sidecar") }) {
						t.Errorf("%s=false: args %q still pass --lazyfs-sidecar", v.path, args)
					}
					return
				}
				if !slices.Contains(args, v.arg) {
					t.Errorf("--set %s=%s: %s args %q lack %s", v.path, v.set, tc.container, args, v.arg)
				}
			})
		}
	}
}

// containerArgs returns the args of a container of the named workload; a
// container that is not there has none.
func containerArgs(t *testing.T, objs []*unstructured.Unstructured, kind, container string) []string {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != kind {
			continue
		}
		var spec corev1.PodTemplateSpec
		var err error
		switch kind {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds)
			spec = ds.Spec.Template
		case "Deployment":
			var d appsv1.Deployment
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d)
			spec = d.Spec.Template
		}
		if err != nil {
			t.Fatalf("%s: %v", key(o), err)
		}
		for _, c := range spec.Spec.Containers {
			if c.Name == container {
				return c.Args
			}
		}
		return nil
	}
	t.Fatalf("the chart renders no %s", kind)
	return nil
}

// classParameters are the parameters the node agent takes, as its refusal
// of an unknown one names them (docs/reference.md's test reads them the
// same way).
func classParameters(t *testing.T) []string {
	t.Helper()
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	_, err := kit.ParseClass(&storagev1.StorageClass{VolumeBindingMode: &mode, Parameters: map[string]string{"not-a-parameter": "x"}})
	if err == nil {
		t.Fatal("the node agent takes a class with parameter not-a-parameter")
	}
	_, list, ok := strings.Cut(err.Error(), "the valid parameters are ")
	if !ok {
		t.Fatalf("the refusal %q does not list the valid parameters; this test reads them from it", err)
	}
	var params []string
	for _, p := range regexp.MustCompile(`, | and `).Split(list, -1) {
		params = append(params, strings.TrimSpace(p))
	}
	slices.Sort(params)
	return params
}

// schemaClassParameters reads the parameters values.schema.json allows a
// StorageClass.
func schemaClassParameters(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			StorageClasses struct {
				Items struct {
					Properties struct {
						Parameters struct {
							Properties           map[string]any `json:"properties"`
							AdditionalProperties *bool          `json:"additionalProperties"`
						} `json:"parameters"`
					} `json:"properties"`
				} `json:"items"`
			} `json:"storageClasses"`
		} `json:"properties"`
	}
	if err := yaml.Unmarshal(data, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	p := schema.Properties.StorageClasses.Items.Properties.Parameters
	if p.AdditionalProperties == nil || *p.AdditionalProperties {
		t.Errorf("values.schema.json lets a StorageClass take parameters it does not list: set additionalProperties: false")
	}
	return slices.Sorted(maps.Keys(p.Properties))
}

// TestEveryClassParameterIsAValue: the schema lists exactly the node
// agent's StorageClass parameters, and a class of the values with all of
// them set renders into one the node agent takes.
func TestEveryClassParameterIsAValue(t *testing.T) {
	code, schema := classParameters(t), schemaClassParameters(t)
	if !slices.Equal(code, schema) {
		t.Errorf("the node agent takes StorageClass parameters %q, values.schema.json lists %q", code, schema)
	}
	all := map[string]string{
		"cache": "{{ .Namespace }}-{{ .Volume }}", "fallback": "main", "uid": "1000", "gid": "1000", "mode": "0775",
		"allowSetuid": "true", "allowDevices": "true", "layout": "overlay", "registry": "registry.example:5000/ci-caches",
		"registrySecret": "ci-cache-registry", "syncTimeout": "90s", "maxLayerSize": "20Gi", "mountFirst": "false", "clusterMaxAge": "168h",
	}
	if got := slices.Sorted(maps.Keys(all)); !slices.Equal(got, code) {
		t.Fatalf("this test sets parameters %q, the node agent takes %q: give the new ones a value here", got, code)
	}
	values := "storageClasses:\n  - name: every-parameter\n    parameters:\n"
	for _, k := range slices.Sorted(maps.Keys(all)) {
		values += fmt.Sprintf("      %s: %q\n", k, all[k])
	}
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	var classes []storagev1.StorageClass
	for _, o := range renderChart(t, "--values", file) {
		if o.GetKind() != "StorageClass" {
			continue
		}
		var sc storagev1.StorageClass
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &sc); err != nil {
			t.Fatal(err)
		}
		classes = append(classes, sc)
	}
	if len(classes) != 1 || classes[0].Name != "every-parameter" {
		t.Fatalf("rendered classes %v, want every-parameter only (the values' list replaces the default one)", classes)
	}
	if !reflect.DeepEqual(classes[0].Parameters, all) {
		t.Errorf("class parameters = %v, want %v", classes[0].Parameters, all)
	}
	if _, err := kit.ParseClass(&classes[0]); err != nil {
		t.Errorf("the node agent refuses the rendered class: %v", err)
	}
}

// TestSchemaRefusesBadValues: a value the components would refuse at
// start is refused at install, naming the value.
func TestSchemaRefusesBadValues(t *testing.T) {
	for _, tc := range []struct{ set, names string }{
		{"node.gcMinFree=lots", "/node/gcMinFree"},
		{"node.gcMinFreePercent=100", "/node/gcMinFreePercent"},
		{"node.registryCompression=lz4", "/node/registryCompression"},
		{"node.maxLayers=0", "/node/maxLayers"},
		{"manager.cacheMaxAge=30d", "/manager/cacheMaxAge"},
		{"hostRoot=var/lib/layercache", "/hostRoot"},
		{"node.unknownFlag=1", "unknownFlag"},
		{"storageClasses[0].parameters.layout=zfs", "/storageClasses/0/parameters/layout"},
		{"storageClasses[0].parameters.registryUrl=x", "registryUrl"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := helm(t, "template", release, chartDir, "--namespace", namespace, "--set", tc.set)
			if err == nil {
				t.Fatalf("--set %s: rendered, want a schema error", tc.set)
			}
			if !strings.Contains(err.Error(), tc.names) {
				t.Errorf("--set %s: error %v does not name %s", tc.set, err, tc.names)
			}
		})
	}
}

// TestHostPathsFollowTheirValues: PVs carry host paths and the kubelet
// dials the CSI socket where the agent names it, so the agent must see
// the store and the kubelet's directory at the host's paths: the values
// move the flag, the mounts and the host paths together, and an empty
// kubeletDir drops CSI volumes' flag, mount and CSIDriver.
func TestHostPathsFollowTheirValues(t *testing.T) {
	for _, tc := range []struct {
		name             string
		sets             []string
		root, kubeletDir string
	}{
		{"defaults", nil, "/var/lib/layercache", "/var/lib/kubelet"},
		{"moved", []string{"--set", "hostRoot=/srv/layercache", "--set", "kubeletDir=/srv/kubelet"}, "/srv/layercache", "/srv/kubelet"},
		{"no CSI volumes", []string{"--set", "kubeletDir="}, "/var/lib/layercache", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ds appsv1.DaemonSet
			csiDriver := false
			for _, o := range renderChart(t, tc.sets...) {
				csiDriver = csiDriver || o.GetKind() == "CSIDriver"
				if o.GetKind() == "DaemonSet" {
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
						t.Fatal(err)
					}
				}
			}
			hostPaths := map[string]string{}
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.HostPath != nil {
					hostPaths[v.Name] = v.HostPath.Path
				}
			}
			want := map[string]string{"root": tc.root}
			if tc.kubeletDir != "" {
				want["kubelet"] = tc.kubeletDir
			}
			if !reflect.DeepEqual(hostPaths, want) {
				t.Errorf("host path volumes %v, want %v", hostPaths, want)
			}
			for _, c := range ds.Spec.Template.Spec.Containers {
				for _, m := range c.VolumeMounts {
					if m.MountPath != hostPaths[m.Name] {
						t.Errorf("container %s mounts %s at %s, the host has it at %s", c.Name, m.Name, m.MountPath, hostPaths[m.Name])
					}
				}
				if !slices.Contains(c.Args, "--root="+tc.root) {
					t.Errorf("container %s args %q lack --root=%s", c.Name, c.Args, tc.root)
				}
			}
			agentArgs := ds.Spec.Template.Spec.Containers[0].Args
			hasFlag := slices.ContainsFunc(agentArgs, func(a string) bool { return strings.HasPrefix(a, "--kubelet-dir") })
			if csiDriver != (tc.kubeletDir != "") {
				t.Errorf("CSIDriver rendered: %v, want it exactly when the agent serves CSI volumes (kubeletDir %q)", csiDriver, tc.kubeletDir)
			}
			if hasFlag != (tc.kubeletDir != "") || (hasFlag && !slices.Contains(agentArgs, "--kubelet-dir="+tc.kubeletDir)) {
				t.Errorf("node agent args %q, want --kubelet-dir=%s (none if empty)", agentArgs, tc.kubeletDir)
			}
		})
	}
}

// TestReleaseNamespace: installed into another namespace, every namespaced
// object, binding subject and the admission policy that names the agents'
// service account follow the release's namespace; none is left in the
// package's.
func TestReleaseNamespace(t *testing.T) {
	const other = "ci-cache"
	out, err := helm(t, "template", release, chartDir, "--namespace", other)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(namespace)) {
		for i, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, namespace) {
				t.Errorf("line %d of the chart in namespace %s still names %s: %s", i+1, other, namespace, line)
			}
		}
	}
	if !bytes.Contains(out, []byte("r'"+other+"'")) {
		t.Errorf("policy layercache-agent-state does not name the agents' namespace %s", other)
	}
}
