//go:build e2e

// Package tekton holds the e2e scenarios of layercache under Tekton
// Pipelines v1.6.0, built from source and installed by
// e2e/cluster/tekton.sh (make up WITH=tekton; make e2e asks for it):
// PipelineRun workspaces from a volumeClaimTemplate that names a cache,
// shared by two Tasks and warm in the next run; a failed PipelineRun; a
// Task-level generic ephemeral cache volume; a TaskRun's workspace as a
// CSI inline volume of layercache's driver. The build is real: the step
// compiles e2e/framework/testdata/hello with GOCACHE and GOMODCACHE on the
// cache, as a non-root user, with this machine's Go toolchain and module
// download cache as read-only hostPaths (see e2e/framework/gobuild.go,
// shared with e2e/argo).
//
// Every pod runs on the cluster's first node, where its cache lives.
package tekton

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/e2e/framework"
)

const (
	// runTimeout bounds one PipelineRun or TaskRun, a cold Go build on a
	// busy 2-core machine included.
	runTimeout   = 8 * time.Minute
	pollInterval = 500 * time.Millisecond

	// storageClass is layercache with volume roots owned by the build
	// user: Tekton's steps run as framework.BuildUID, and a hostPath PV
	// takes no fsGroup.
	storageClass = "layercache-tekton-e2e"

	busyboxImage = framework.ImageBusybox
)

var (
	pipelineRunsGVR = schema.GroupVersionResource{Group: "tekton.dev", Version: "v1", Resource: "pipelineruns"}
	taskRunsGVR     = schema.GroupVersionResource{Group: "tekton.dev", Version: "v1", Resource: "taskruns"}
	pipelinesGVR    = schema.GroupVersionResource{Group: "tekton.dev", Version: "v1", Resource: "pipelines"}
)

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
	e.EnsureBuildStorageClass(ctx, storageClass)
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

// deleteRun deletes a PipelineRun or TaskRun the way users and pruners do
// (background propagation: the claim it owns goes with it).
func (e *env) deleteRun(ctx context.Context, gvr schema.GroupVersionResource, name string) {
	e.t.Helper()
	bg := metav1.DeletePropagationBackground
	if err := e.Dyn.Resource(gvr).Namespace(e.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		e.t.Fatalf("deleting %s %s: %v", gvr.Resource, name, err)
	}
}
