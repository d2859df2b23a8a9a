// Package config holds the deploy package (kpt package and kustomizations);
// this test checks that it renders and keeps the promises other parts rely
// on: the e2e overlay's host networking, the node agent's host root
// propagation, least-privilege RBAC, setters that agree with the values, and
// kpt and kustomize applying the same objects.
package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
)

const (
	namespace  = "layercache-system"
	hostRoot   = "/var/lib/layercache"
	kubeletDir = "/var/lib/kubelet"
	e2eImage   = "localhost/layercache:dev"
	// releaseImage is what `make image` builds and the package deploys.
	releaseImage = "ghcr.io/layercache/layercache:v0.1.0"
)

// rendered is the output of one kustomization, decoded into typed objects.
type rendered struct {
	objs []runtime.Object
}

func render(t *testing.T, dir string) rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return rendered{objs: decodeAll(t, out)}
}

func decodeAll(t *testing.T, data []byte) []runtime.Object {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decoding %s: %v", doc, err)
		}
		objs = append(objs, obj)
	}
}

func find[T runtime.Object](t *testing.T, r rendered, name string) T {
	t.Helper()
	for _, o := range r.objs {
		if typed, ok := o.(T); ok && objName(o) == name {
			return typed
		}
	}
	var zero T
	t.Fatalf("no %T %s in the rendered package", zero, name)
	return zero
}

func objName(o runtime.Object) string {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		return ""
	}
	return (&unstructured.Unstructured{Object: u}).GetName()
}

func TestDefault(t *testing.T) {
	r := render(t, "default")

	ns := find[*corev1.Namespace](t, r, namespace)
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s: the node agent is privileged, so the namespace must allow it: labels %v", namespace, ns.Labels)
	}

	sc := find[*storagev1.StorageClass](t, r, v1alpha1.StorageClassName)
	if sc.Provisioner != v1alpha1.ProvisionerName || sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer ||
		sc.ReclaimPolicy == nil || *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("StorageClass = %+v, want provisioner %s, WaitForFirstConsumer, Delete", sc, v1alpha1.ProvisionerName)
	}
	snap := find[*storagev1.StorageClass](t, r, v1alpha1.SnapshotStorageClassName)
	if snap.Provisioner != sc.Provisioner || *snap.VolumeBindingMode != *sc.VolumeBindingMode || snap.Parameters["layout"] != "snapshot" {
		t.Errorf("StorageClass %s = %+v, want the same provisioner and binding as %s, and layout: snapshot", snap.Name, snap, sc.Name)
	}

	for _, want := range []struct {
		name, kind string
		columns    []string
	}{
		{"caches.layercache.dev", "Cache", []string{"Generation", "Size", "Nodes", "Last Used", "Seeded From", "Age"}},
		{"cachereplicas.layercache.dev", "CacheReplica", []string{"Cache", "Node", "Generation", "Layers", "Bytes", "Unpublished", "Filling", "Last Used"}},
	} {
		crd := find[*apiextensionsv1.CustomResourceDefinition](t, r, want.name)
		if crd.Spec.Scope != apiextensionsv1.NamespaceScoped || crd.Spec.Names.Kind != want.kind {
			t.Errorf("CRD %s: scope %s kind %s, want Namespaced %s", want.name, crd.Spec.Scope, crd.Spec.Names.Kind, want.kind)
		}
		var columns []string
		for _, c := range crd.Spec.Versions[0].AdditionalPrinterColumns {
			columns = append(columns, c.Name)
		}
		if !slices.Equal(columns, want.columns) {
			t.Errorf("CRD %s: printer columns = %q, want %q", want.name, columns, want.columns)
		}
	}

	ds := find[*appsv1.DaemonSet](t, r, "layercache-node")
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("node agent is not privileged; it mounts overlay filesystems")
	}
	if !slices.Contains(c.Args, "--root="+hostRoot) || c.Args[0] != "node" {
		t.Errorf("node agent args = %q, want node --root=%s", c.Args, hostRoot)
	}
	for _, want := range []string{"--node-name=$(NODE_NAME)", "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("node agent args = %q, want %s", c.Args, want)
		}
	}
	if len(c.Env) == 0 || c.Env[0].Name != "NODE_NAME" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("node agent env = %+v, want NODE_NAME from spec.nodeName", c.Env)
	}
	if len(c.VolumeMounts) != 2 || len(spec.Volumes) != 2 {
		t.Fatalf("node agent mounts %+v volumes %+v, want the host root and the kubelet's directory", c.VolumeMounts, spec.Volumes)
	}
	// PVs carry host paths, so the agent must see the root where the host
	// does; the kubelet dials the CSI socket and mounts the targets at the
	// paths the agent names, so the same holds for the kubelet's directory.
	for i, want := range []struct{ name, path string }{{"root", hostRoot}, {"kubelet", kubeletDir}} {
		m, v := c.VolumeMounts[i], spec.Volumes[i]
		if m.Name != want.name || m.MountPath != want.path || v.HostPath == nil || v.HostPath.Path != want.path {
			t.Errorf("%s mounted at %s from %+v, want %s at the same path", want.name, m.MountPath, v.HostPath, want.path)
		}
		if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
			t.Errorf("%s propagation = %v, want Bidirectional so mounts reach the kubelet", want.name, m.MountPropagation)
		}
	}
	if want := "--kubelet-dir=" + kubeletDir; !slices.Contains(c.Args, want) {
		t.Errorf("node agent args = %q, want %s", c.Args, want)
	}
	drv := find[*storagev1.CSIDriver](t, r, v1alpha1.CSIDriverName)
	if drv.Spec.AttachRequired == nil || *drv.Spec.AttachRequired || drv.Spec.PodInfoOnMount == nil || !*drv.Spec.PodInfoOnMount ||
		!slices.Equal(drv.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}) {
		t.Errorf("CSIDriver = %+v, want attachRequired false, podInfoOnMount true, Ephemeral only", drv.Spec)
	}
	checkProbes(t, "node agent", c, 8081)

	dep := find[*appsv1.Deployment](t, r, "layercache-manager")
	mc := dep.Spec.Template.Spec.Containers[0]
	if mc.Args[0] != "manager" {
		t.Errorf("manager args = %q, want manager first", mc.Args)
	}
	for _, want := range []string{"--metrics-bind-address=:8082", "--health-probe-bind-address=:8083"} {
		if !slices.Contains(mc.Args, want) {
			t.Errorf("manager args = %q, want %s (the node agent uses 8080 and 8081 on the same host)", mc.Args, want)
		}
	}
	if want := "--cache-max-age=720h"; !slices.Contains(mc.Args, want) {
		t.Errorf("manager args = %q, want %s, the default said where operators change it", mc.Args, want)
	}
	psc, sc2 := dep.Spec.Template.Spec.SecurityContext, mc.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("manager pod security context = %+v, want non-root with a numeric user", psc)
	}
	if sc2 == nil || sc2.ReadOnlyRootFilesystem == nil || !*sc2.ReadOnlyRootFilesystem || sc2.AllowPrivilegeEscalation == nil || *sc2.AllowPrivilegeEscalation {
		t.Errorf("manager container security context = %+v, want a read-only root and no privilege escalation", sc2)
	}
	checkProbes(t, "manager", mc, 8083)

	for _, sa := range []struct{ pod corev1.PodSpec }{{spec}, {dep.Spec.Template.Spec}} {
		find[*corev1.ServiceAccount](t, r, sa.pod.ServiceAccountName)
	}
}

func checkProbes(t *testing.T, who string, c corev1.Container, port int32) {
	t.Helper()
	var health int32
	for _, p := range c.Ports {
		if p.Name == "health" {
			health = p.ContainerPort
		}
	}
	if health != port {
		t.Errorf("%s health port = %d, want %d", who, health, port)
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "health" {
			t.Errorf("%s probe = %+v, want an HTTP probe on the health port", who, p)
		}
	}
}

// The local e2e cluster's API server is at 127.0.0.1:6443 and there is no
// registry (team conventions).
func TestE2EOverlay(t *testing.T) {
	r := render(t, "e2e")
	dep := find[*appsv1.Deployment](t, r, "layercache-manager")
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("manager replicas = %v, want 1", dep.Spec.Replicas)
	}
	ds := find[*appsv1.DaemonSet](t, r, "layercache-node")
	for name, spec := range map[string]corev1.PodSpec{"manager": dep.Spec.Template.Spec, "node agent": ds.Spec.Template.Spec} {
		if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Errorf("%s: hostNetwork %v dnsPolicy %s, want true and ClusterFirstWithHostNet", name, spec.HostNetwork, spec.DNSPolicy)
		}
		// Every container: the node agent's lazyfs sidecar runs the
		// same image, which no registry of the local cluster serves.
		for _, c := range spec.Containers {
			if c.Image != e2eImage || c.ImagePullPolicy != corev1.PullNever {
				t.Errorf("%s: container %s: image %s pull %s, want %s and Never", name, c.Name, c.Image, c.ImagePullPolicy, e2eImage)
			}
		}
		c := spec.Containers[0]
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if env["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
			t.Errorf("%s: env %v, want KUBERNETES_SERVICE_HOST=127.0.0.1 and KUBERNETES_SERVICE_PORT=6443", name, env)
		}
	}
	hasNodeName := slices.ContainsFunc(ds.Spec.Template.Spec.Containers[0].Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil
	})
	if !hasNodeName {
		t.Errorf("the e2e overlay dropped NODE_NAME")
	}
	args := ds.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--gc-min-free-percent=1") {
		t.Errorf("node agent args %q: want --gc-min-free-percent=1, so that a shared disk's low free space does not evict the scenarios' caches", args)
	}
	// The nodes share the host's network, each with its own address.
	for _, want := range []string{"--metrics-bind-address=$(NODE_IP):8080", "--health-probe-bind-address=$(NODE_IP):8081"} {
		if !slices.Contains(args, want) {
			t.Errorf("node agent args %q lack %s: the agents of two nodes would take each other's ports", args, want)
		}
	}
	hasNodeIP := slices.ContainsFunc(ds.Spec.Template.Spec.Containers[0].Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
	})
	if !hasNodeIP {
		t.Errorf("node agent env lacks NODE_IP from status.hostIP, which its bind addresses use")
	}
}

// permission is one thing a component must be allowed to do.
type permission struct{ group, resource, verb string }

func TestRBAC(t *testing.T) {
	r := render(t, "default")
	tests := []struct {
		role, account string
		must          []permission
		mustNot       []permission
	}{{
		role: "layercache-node", account: "layercache-node",
		must: []permission{
			{"", "persistentvolumeclaims", "watch"}, {"", "persistentvolumeclaims", "update"},
			{"", "persistentvolumes", "create"}, {"", "persistentvolumes", "delete"}, {"", "persistentvolumes", "patch"},
			{"storage.k8s.io", "storageclasses", "watch"}, {"", "nodes", "get"},
			{"layercache.dev", "caches", "create"}, {"layercache.dev", "caches", "watch"}, {"layercache.dev", "caches/status", "patch"},
			// patch: the registry finalizer, which an agent adds when it
			// creates a chain and removes once the manifest is deleted.
			{"layercache.dev", "caches", "patch"},
			{"", "events", "create"}, {"", "pods", "watch"}, {"", "pods", "get"},
			// patch: finalizer layercache.dev/build-end only, as the
			// ValidatingAdmissionPolicy layercache-node-pods enforces.
			{"", "pods", "patch"},
		},
		mustNot: []permission{{"", "pods", "delete"}, {"", "pods", "update"}, {"", "pods/status", "patch"}, {"", "persistentvolumeclaims", "delete"}, {"layercache.dev", "caches", "delete"}, {"layercache.dev", "caches", "update"}, {"", "secrets", "get"}},
	}, {
		role: "layercache-manager", account: "layercache-manager",
		must: []permission{
			{"", "pods", "watch"}, {"", "persistentvolumeclaims", "delete"}, {"", "persistentvolumeclaims", "patch"},
			{"", "persistentvolumes", "patch"}, {"storage.k8s.io", "storageclasses", "watch"}, {"", "nodes", "watch"},
			{"layercache.dev", "caches", "patch"}, {"layercache.dev", "caches/status", "patch"},
			{"", "events", "create"}, {"events.k8s.io", "events", "create"},
		},
		mustNot: []permission{{"", "persistentvolumes", "create"}, {"", "persistentvolumes", "delete"}, {"", "pods", "delete"}, {"", "pods", "update"}, {"coordination.k8s.io", "leases", "create"}, {"", "secrets", "get"}},
	}}
	for _, tc := range tests {
		t.Run(tc.role, func(t *testing.T) {
			role := find[*rbacv1.ClusterRole](t, r, tc.role)
			for _, rule := range role.Rules {
				for _, s := range slices.Concat(rule.Verbs, rule.Resources, rule.APIGroups) {
					if s == "*" {
						t.Errorf("rule %+v uses a wildcard", rule)
					}
				}
			}
			for _, p := range tc.must {
				if !allows(role.Rules, p) {
					t.Errorf("%s cannot %s %s in group %q", tc.role, p.verb, p.resource, p.group)
				}
			}
			for _, p := range tc.mustNot {
				if allows(role.Rules, p) {
					t.Errorf("%s can %s %s in group %q, which it does not need", tc.role, p.verb, p.resource, p.group)
				}
			}
			binding := find[*rbacv1.ClusterRoleBinding](t, r, tc.role)
			if binding.RoleRef.Name != tc.role || len(binding.Subjects) != 1 ||
				binding.Subjects[0].Name != tc.account || binding.Subjects[0].Namespace != namespace {
				t.Errorf("binding %+v, want %s bound to %s/%s", binding, tc.role, namespace, tc.account)
			}
		})
	}

	// Leader election stays in the manager's namespace.
	role := find[*rbacv1.Role](t, r, "layercache-manager")
	if role.Namespace != namespace || !allows(role.Rules, permission{"coordination.k8s.io", "leases", "update"}) {
		t.Errorf("leader election role = %+v, want leases in %s", role, namespace)
	}
	binding := find[*rbacv1.RoleBinding](t, r, "layercache-manager")
	if binding.Namespace != namespace || binding.Subjects[0].Name != "layercache-manager" {
		t.Errorf("leader election binding = %+v", binding)
	}

	// Registry Secrets: read in the agents' own namespace only, never
	// listed or watched.
	secrets := find[*rbacv1.Role](t, r, "layercache-node")
	if secrets.Namespace != namespace || !allows(secrets.Rules, permission{"", "secrets", "get"}) ||
		allows(secrets.Rules, permission{"", "secrets", "list"}) || allows(secrets.Rules, permission{"", "secrets", "watch"}) {
		t.Errorf("registry secrets role = %+v, want get secrets in %s and nothing more", secrets, namespace)
	}
	binding = find[*rbacv1.RoleBinding](t, r, "layercache-node")
	if binding.Namespace != namespace || binding.Subjects[0].Name != "layercache-node" {
		t.Errorf("registry secrets binding = %+v", binding)
	}
}

func allows(rules []rbacv1.PolicyRule, p permission) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, p.group) && slices.Contains(r.Resources, p.resource) && slices.Contains(r.Verbs, p.verb) {
			return true
		}
	}
	return false
}

// krmIgnored reports whether .krmignore keeps kpt from reading the
// directory dir (its lines name directories, as "monitoring/").
func krmIgnored(t *testing.T, dir string) bool {
	t.Helper()
	data, err := os.ReadFile(".krmignore")
	if err != nil {
		t.Fatalf("read .krmignore: %v", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") && filepath.Clean(line) == filepath.Clean(dir) {
			return true
		}
	}
	return false
}

// packageFiles returns the YAML files of the kpt package with their parsed
// documents.
func packageFiles(t *testing.T) map[string][]map[string]any {
	t.Helper()
	files := map[string][]map[string]any{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && krmIgnored(t, path) {
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() || (filepath.Ext(path) != ".yaml" && d.Name() != "Kptfile") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for doc := range strings.SplitSeq(string(data), "\n---\n") {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if m != nil {
				files[path] = append(files[path], m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func isLocalConfig(m map[string]any) bool {
	meta, _ := m["metadata"].(map[string]any)
	ann, _ := meta["annotations"].(map[string]any)
	v, ok := ann["config.kubernetes.io/local-config"]
	return ok && v != "false"
}

// `kpt live apply config` reads every YAML file of the package except local
// config; `kubectl apply -k config/default` reads the kustomization. Both
// must apply the same objects.
func TestKptAndKustomizeApplyTheSame(t *testing.T) {
	var fromKpt []string
	for path, docs := range packageFiles(t) {
		for _, m := range docs {
			// kpt keeps its inventory (ResourceGroup) apart from what it applies.
			if isLocalConfig(m) || m["kind"] == "ResourceGroup" {
				continue
			}
			meta, _ := m["metadata"].(map[string]any)
			fromKpt = append(fromKpt, fmt.Sprintf("%s %v/%v", m["kind"], meta["namespace"], meta["name"]))
			if m["kind"] == "Kustomization" || m["kind"] == "Kptfile" {
				t.Errorf("%s: %s is not marked local config, so kpt would apply it", path, m["kind"])
			}
		}
	}
	var fromKustomize []string
	for _, o := range render(t, "default").objs {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{Object: u}
		ns := any(obj.GetNamespace())
		if obj.GetNamespace() == "" {
			ns = nil
		}
		fromKustomize = append(fromKustomize, fmt.Sprintf("%s %v/%v", kindOf(o), ns, obj.GetName()))
	}
	slices.Sort(fromKpt)
	slices.Sort(fromKustomize)
	if !slices.Equal(fromKpt, fromKustomize) {
		t.Errorf("kpt applies\n  %s\nkustomize applies\n  %s", strings.Join(fromKpt, "\n  "), strings.Join(fromKustomize, "\n  "))
	}
}

func kindOf(o runtime.Object) string {
	t := fmt.Sprintf("%T", o)
	return t[strings.LastIndex(t, ".")+1:]
}

// kptSet matches a field that a setter sets: `value # kpt-set: template`.
var kptSet = regexp.MustCompile(`^\s*(?:-\s+)?(?:[\w.-]+:\s+)?(\S+)\s+# kpt-set: (\S+)$`)

// The values in the package must be what apply-setters would write from
// setters.yaml, so the package as committed is already rendered.
func TestSettersAgreeWithValues(t *testing.T) {
	setters := packageFiles(t)["setters.yaml"]
	if len(setters) != 1 {
		t.Fatalf("setters.yaml has %d documents, want 1", len(setters))
	}
	data, _ := setters[0]["data"].(map[string]any)
	want := map[string]string{"image": releaseImage, "namespace": namespace, "host-root": hostRoot, "kubelet-dir": kubeletDir}
	for k, v := range want {
		if data[k] != v {
			t.Errorf("setter %s = %v, want %s", k, data[k], v)
		}
	}
	used := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && krmIgnored(t, path) {
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() || (filepath.Ext(path) != ".yaml" && d.Name() != "Kptfile") {
			return err
		}
		f, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(f), "\n") {
			if !strings.Contains(line, "# kpt-set:") || strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			m := kptSet.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("%s:%d: cannot parse setter line %q", path, i+1, line)
				continue
			}
			value := regexp.MustCompile(`\$\{([\w-]+)\}`).ReplaceAllStringFunc(m[2], func(ref string) string {
				name := ref[2 : len(ref)-1]
				used[name] = true
				v, ok := data[name].(string)
				if !ok {
					t.Errorf("%s:%d: setter %s is not in setters.yaml", path, i+1, name)
				}
				return v
			})
			if m[1] != value {
				t.Errorf("%s:%d: value %s, but setter gives %s", path, i+1, m[1], value)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range data {
		if !used[name] {
			t.Errorf("setter %s is used by no field", name)
		}
	}
}

// The node agent may patch pods only through the policy that keeps it to
// its finalizer, and write only its own node's CacheReplicas (e2e's
// TestNodeAgentPodPolicy and TestNodeAgentReplicaPolicy check the API
// server enforces them).
func TestNodeAgentPolicies(t *testing.T) {
	r := render(t, "default")
	for _, name := range []string{"layercache-node-pods", "layercache-node-replicas", "layercache-agent-state"} {
		policy := find[*admissionregistrationv1.ValidatingAdmissionPolicy](t, r, name)
		if policy.Spec.FailurePolicy == nil || *policy.Spec.FailurePolicy != admissionregistrationv1.Fail || len(policy.Spec.Validations) == 0 {
			t.Errorf("policy %s: failurePolicy %v, %d validations; want Fail and some", policy.Name, policy.Spec.FailurePolicy, len(policy.Spec.Validations))
		}
		binding := find[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, r, name)
		if binding.Spec.PolicyName != policy.Name || !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
			t.Errorf("binding %+v, want policy %s with Deny", binding.Spec, policy.Name)
		}
	}
}

// The components' /metrics name every namespace's caches, unauthenticated
// (issue 33, finding 11): the package ships a NetworkPolicy that admits
// scrapes of both components' metrics port only from namespaces labeled
// layercache.dev/metrics=allowed, and their health port (the kubelet's
// probes) from anywhere.
func TestMetricsAreNotOpenToEveryNamespace(t *testing.T) {
	r := render(t, "default")
	policy := find[*networkingv1.NetworkPolicy](t, r, "layercache-metrics")
	selector, err := metav1.LabelSelectorAsSelector(&policy.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range []map[string]string{
		find[*appsv1.DaemonSet](t, r, "layercache-node").Spec.Template.Labels,
		find[*appsv1.Deployment](t, r, "layercache-manager").Spec.Template.Labels,
	} {
		if !selector.Matches(labels.Set(pod)) {
			t.Errorf("the policy's pod selector %s misses pods labeled %v", selector, pod)
		}
	}
	if policy.Namespace != namespace || !slices.Equal(policy.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policy in namespace %q with types %v, want %q and Ingress", policy.Namespace, policy.Spec.PolicyTypes, namespace)
	}
	open := map[string][]networkingv1.NetworkPolicyPeer{} // port name -> who may reach it (none listed: anyone)
	for _, rule := range policy.Spec.Ingress {
		for _, p := range rule.Ports {
			open[p.Port.String()] = rule.From
		}
	}
	scrapers := []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"layercache.dev/metrics": "allowed"}}}}
	if from, ok := open["metrics"]; !ok || !reflect.DeepEqual(from, scrapers) {
		t.Errorf("port metrics is open to %+v, want only namespaces labeled layercache.dev/metrics=allowed", from)
	}
	if from, ok := open["health"]; !ok || len(from) != 0 {
		t.Errorf("port health is open to %+v (listed: %v), want anyone (the kubelet's probes)", from, ok)
	}
	if len(open) != 2 {
		t.Errorf("the policy admits ports %v, want metrics and health only", slices.Sorted(maps.Keys(open)))
	}
}
