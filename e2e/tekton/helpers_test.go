//go:build e2e

// Package tekton holds the e2e scenarios of layercache under Tekton
// Pipelines v1.6.0, built from source and installed by
// e2e/cluster/tekton.sh (make up WITH=tekton; make e2e asks for it):
// PipelineRun workspaces from a volumeClaimTemplate that names a cache,
// shared by two Tasks and warm in the next run; a failed PipelineRun; a
// Task-level generic ephemeral cache volume. The build is real: the step
// compiles testdata/hello with GOCACHE and GOMODCACHE on the cache, as a
// non-root user, with this machine's Go toolchain (a read-only hostPath of
// GOROOT: 270 MB that an image would copy into every node's containerd for
// nothing) and the module sources from this machine's module download
// cache as a file:// GOPROXY (the pods reach no network).
//
// Every pod runs on the cluster's first node, where its cache lives.
package tekton

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

const (
	// runTimeout bounds one PipelineRun or TaskRun, a cold Go build on a
	// busy 2-core machine included.
	runTimeout = 8 * time.Minute
	// volumeTimeout bounds the way from a claim's end to its volume being
	// committed or discarded.
	volumeTimeout = 2 * time.Minute
	pollInterval  = 500 * time.Millisecond

	// storageClass is layercache with volume roots owned by the build
	// user: Tekton's steps run as buildUID, and a hostPath PV takes no
	// fsGroup.
	storageClass = "layercache-tekton-e2e"
	buildUID     = 1000

	busyboxImage = "localhost/busybox:e2e"
	// goProxyModule is the one module testdata/hello needs; the test
	// makes sure the host's module cache has it.
	goProxyModule = "github.com/spf13/pflag@v1.0.10"
)

var (
	pipelineRunsGVR = schema.GroupVersionResource{Group: "tekton.dev", Version: "v1", Resource: "pipelineruns"}
	taskRunsGVR     = schema.GroupVersionResource{Group: "tekton.dev", Version: "v1", Resource: "taskruns"}
	pipelinesGVR    = schema.GroupVersionResource{Group: "tekton.dev", Version: "v1", Resource: "pipelines"}
)

// testdata/hello's go.mod and go.sum carry a .txt suffix: a directory with
// a go.mod is another module, whose files cannot be embedded.
//
//go:embed testdata/hello/main.go testdata/hello/go.mod.txt testdata/hello/go.sum.txt
var helloSource embed.FS

// env is one scenario's handle: the framework's namespace and clients, a
// dynamic client for Tekton's resources and the node the pods run on.
type env struct {
	*framework.Framework
	Dyn  dynamic.Interface
	Node framework.Node
	t    testing.TB
}

func newEnv(t *testing.T) *env {
	t.Helper()
	f := framework.New(t)
	dyn, err := dynamic.NewForConfig(f.Config)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{Framework: f, Dyn: dyn, Node: f.Cluster.Nodes[0], t: t}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.requireTekton(ctx)
	e.ensureStorageClass(ctx)
	return e
}

// requireTekton fails (not skips) the test when Tekton is not installed.
func (e *env) requireTekton(ctx context.Context) {
	e.t.Helper()
	d, err := e.Client.AppsV1().Deployments("tekton-pipelines").Get(ctx, "tekton-pipelines-controller", metav1.GetOptions{})
	if err != nil || d.Status.ReadyReplicas < 1 {
		e.t.Fatalf("Tekton Pipelines is not installed or not ready (%v): start the cluster with `make up WITH=tekton` (make e2e does), or run e2e/cluster/tekton.sh", err)
	}
}

// ensureStorageClass creates the build user's layercache class once; the
// scenarios share it.
func (e *env) ensureStorageClass(ctx context.Context) {
	e.t.Helper()
	wait1st := storagev1.VolumeBindingWaitForFirstConsumer
	del := corev1.PersistentVolumeReclaimDelete
	uid := strconv.Itoa(buildUID)
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: storageClass, Labels: map[string]string{framework.E2ELabel: "true"}},
		Provisioner:       v1alpha1.ProvisionerName,
		Parameters:        map[string]string{"uid": uid, "gid": uid, "mode": "0775"},
		VolumeBindingMode: &wait1st,
		ReclaimPolicy:     &del,
	}
	_, err := e.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatalf("creating StorageClass %s: %v", storageClass, err)
	}
}

// object decodes a YAML manifest, formatted with args, into an object in
// the scenario's namespace.
func (e *env) object(manifest string, args ...any) *unstructured.Unstructured {
	e.t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(fmt.Sprintf(manifest, args...)), &m); err != nil {
		e.t.Fatalf("manifest: %v\n%s", err, fmt.Sprintf(manifest, args...))
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetNamespace(e.Namespace)
	return u
}

func (e *env) create(ctx context.Context, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) {
	e.t.Helper()
	if _, err := e.Dyn.Resource(gvr).Namespace(e.Namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
	}
}

// run is a finished PipelineRun or TaskRun.
type run struct {
	Obj       *unstructured.Unstructured
	Succeeded bool
	Reason    string
	Results   map[string]string
}

// waitRun waits until the PipelineRun or TaskRun name is done.
func (e *env) waitRun(ctx context.Context, gvr schema.GroupVersionResource, name string) run {
	e.t.Helper()
	var last *unstructured.Unstructured
	var r run
	err := wait.PollUntilContextTimeout(ctx, pollInterval, runTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := e.Dyn.Resource(gvr).Namespace(e.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = u
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			cm, _ := c.(map[string]any)
			if cm["type"] != "Succeeded" || cm["status"] == "Unknown" {
				continue
			}
			r = run{Obj: u, Succeeded: cm["status"] == "True", Reason: fmt.Sprint(cm["reason"], ": ", cm["message"]), Results: results(u)}
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		var status any
		if last != nil {
			status = last.Object["status"]
		}
		e.t.Fatalf("%s %s did not finish within %s: %v; status: %v", gvr.Resource, name, runTimeout, err, status)
	}
	return r
}

// results reads a run's results (PipelineRun status.results, TaskRun
// status.results).
func results(u *unstructured.Unstructured) map[string]string {
	out := map[string]string{}
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "results")
	for _, it := range list {
		m, _ := it.(map[string]any)
		out[fmt.Sprint(m["name"])] = strings.TrimSpace(fmt.Sprint(m["value"]))
	}
	return out
}

// seconds parses a result that holds a duration in seconds.
func (e *env) seconds(r run, name string) time.Duration {
	e.t.Helper()
	v, err := strconv.ParseFloat(r.Results[name], 64)
	if err != nil {
		e.t.Fatalf("%s: result %s = %q is not a number of seconds (results %v)", r.Obj.GetName(), name, r.Results[name], r.Results)
	}
	return time.Duration(v * float64(time.Second))
}

// claimOf returns the claim Tekton made for a run's volumeClaimTemplate
// workspace: the PVC the run controls.
func (e *env) claimOf(ctx context.Context, owner *unstructured.Unstructured) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	var found *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(ctx, pollInterval, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			for _, ref := range list.Items[i].OwnerReferences {
				if ref.UID == owner.GetUID() {
					found = &list.Items[i]
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("no claim owned by %s %s: %v", owner.GetKind(), owner.GetName(), err)
	}
	return found
}

// volumeEnd waits for the node agent's Committed or Discarded Event about
// the PV (or its claim) and returns its reason and message.
func (e *env) volumeEnd(ctx context.Context, claim, pv string) (reason, message string) {
	e.t.Helper()
	subjects := []struct{ ns, kind, name string }{
		{e.Namespace, "PersistentVolumeClaim", claim},
		{metav1.NamespaceDefault, "PersistentVolume", pv},
	}
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, volumeTimeout, true, func(ctx context.Context) (bool, error) {
		seen = seen[:0]
		for _, s := range subjects {
			sel := fields.Set{"involvedObject.kind": s.kind, "involvedObject.name": s.name}.AsSelector().String()
			list, err := e.Client.CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil {
				return false, err
			}
			for _, ev := range list.Items {
				seen = append(seen, s.kind+" "+ev.Reason+": "+ev.Message)
				if ev.Reason == "Committed" || ev.Reason == "Discarded" || ev.Reason == "CommitDropped" {
					reason, message = ev.Reason, ev.Message
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("volume %s of claim %s did not end within %s: %v; events: %q", pv, claim, volumeTimeout, err, seen)
	}
	return reason, message
}

// generation reads the cache's generation on the node (0 if it has none).
func (e *env) generation(ctx context.Context, cache string) int {
	e.t.Helper()
	data, err := e.Cluster.ReadNodeFile(ctx, e.Node, filepath.Join("/var/lib/layercache/caches", e.Namespace, cache, "head.json"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0
		}
		e.t.Fatalf("reading the head of cache %s/%s: %v", e.Namespace, cache, err)
	}
	var head struct {
		Generation int `json:"generation"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		e.t.Fatalf("head of cache %s/%s: %v: %s", e.Namespace, cache, err, data)
	}
	return head.Generation
}

// deleteRun deletes a PipelineRun or TaskRun the way users and pruners do
// (background propagation: the claim it owns goes with it).
func (e *env) deleteRun(ctx context.Context, gvr schema.GroupVersionResource, name string) {
	e.t.Helper()
	bg := metav1.DeletePropagationBackground
	if err := e.Dyn.Resource(gvr).Namespace(e.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		e.t.Fatalf("deleting %s %s: %v", gvr.Resource, name, err)
	}
}

// sourceConfigMap holds testdata/hello, the source the checkout Task
// copies into the workspace (a stand-in for a git clone: the pods reach no
// network).
func (e *env) sourceConfigMap(ctx context.Context, name string) {
	e.t.Helper()
	data := map[string]string{}
	for key, file := range map[string]string{"main.go": "main.go", "go.mod": "go.mod.txt", "go.sum": "go.sum.txt"} {
		b, err := helloSource.ReadFile("testdata/hello/" + file)
		if err != nil {
			e.t.Fatal(err)
		}
		data[key] = string(b)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}
	if _, err := e.Client.CoreV1().ConfigMaps(e.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating ConfigMap %s: %v", name, err)
	}
}

// goPaths returns this machine's GOROOT and module download cache (the
// build step's toolchain and GOPROXY), making sure the cache holds the
// module testdata/hello needs.
func goPaths(t *testing.T) (goroot, downloads string) {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOROOT GOMODCACHE: %v (the build step uses this machine's Go toolchain)", err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != 2 {
		t.Fatalf("go env GOROOT GOMODCACHE printed %q", out)
	}
	goroot, downloads = lines[0], filepath.Join(lines[1], "cache", "download")
	mod, version, _ := strings.Cut(goProxyModule, "@")
	zip := filepath.Join(downloads, mod, "@v", version+".zip")
	if _, err := os.Stat(zip); err != nil {
		// The project's own go.sum pins it; an ordinary download.
		cmd := exec.Command("go", "mod", "download", goProxyModule)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("go mod download %s: %v: %s", goProxyModule, err, stderr.String())
		}
	}
	return goroot, downloads
}
