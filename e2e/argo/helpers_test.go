//go:build e2e

// Package argo holds the e2e scenarios of layercache under Argo Workflows
// v3.7.3, built from source and installed by e2e/cluster/argo.sh (make up
// WITH=argo; make e2e asks for it): a Workflow whose volumeClaimTemplates
// name a cache, run again warm; what Argo's default volumeClaimGC
// (OnWorkflowSuccess) makes of a successful and of a failed Workflow's
// claim, and OnWorkflowCompletion; a per-step cache from a generic
// ephemeral volume, and from a CSI inline volume in the step's template; a
// completed Workflow's namespace left quiet. The build is real: the step compiles
// e2e/framework/testdata/hello with GOCACHE and GOMODCACHE on the cache,
// as a non-root user, with this machine's Go toolchain and module download
// cache as read-only hostPaths (see e2e/framework/gobuild.go, shared with
// e2e/tekton).
//
// Argo creates a volumeClaimTemplates claim itself, named
// <workflow>-<template>, owned by the Workflow: to layercache a standalone
// claim, whose build ends when the claim is deleted, with the outcome of
// the last pods that used it. Argo's executor (the init and wait
// containers of every workflow pod) talks to the API server; on this
// cluster that works only on the host network, which the controller's
// ConfigMap makes the default of every Workflow (see e2e/cluster/argo.sh).
//
// Every pod runs on the cluster's first node, where its cache lives.
package argo

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/argo/manifests"
	"github.com/layercache/layercache/e2e/framework"
)

const (
	// workflowTimeout bounds one Workflow, a cold Go build on a busy
	// 2-core machine included.
	workflowTimeout = 8 * time.Minute
	pollInterval    = 500 * time.Millisecond

	// argoNamespace is where e2e/cluster/argo.sh installs the controller.
	argoNamespace = "argo"

	// storageClass is layercache with volume roots owned by the build
	// user: the workflow pods run as framework.BuildUID, and a hostPath PV
	// takes no fsGroup.
	storageClass = "layercache-argo-e2e"

	// serviceAccount runs the workflow pods, with the executor's rules
	// (manifests.ExecutorClusterRole) bound in the scenario's namespace:
	// the wait container creates and patches WorkflowTaskResults, nothing
	// more.
	serviceAccount = "build"
)

var (
	workflowsGVR           = schema.GroupVersionResource{Group: "argoproj.io", Version: "v1alpha1", Resource: "workflows"}
	workflowTaskResultsGVR = schema.GroupVersionResource{Group: "argoproj.io", Version: "v1alpha1", Resource: "workflowtaskresults"}
)

// env is one scenario's handle: the framework's namespace and clients, a
// dynamic client for Argo's resources and the node the pods run on.
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
	e.requireArgo(ctx)
	e.EnsureBuildStorageClass(ctx, storageClass)
	e.executorAccount(ctx)
	return e
}

// requireArgo fails (not skips) the test when Argo is not installed.
func (e *env) requireArgo(ctx context.Context) {
	e.t.Helper()
	d, err := e.Client.AppsV1().Deployments(argoNamespace).Get(ctx, "workflow-controller", metav1.GetOptions{})
	if err != nil || d.Status.ReadyReplicas < 1 {
		e.t.Fatalf("Argo Workflows is not installed or not ready (%v): start the cluster with `make up WITH=argo` (make e2e does), or run e2e/cluster/argo.sh", err)
	}
}

// executorAccount creates the workflow pods' ServiceAccount and binds the
// executor's ClusterRole to it in the namespace, as Argo's quick start
// binds its executor Role.
func (e *env) executorAccount(ctx context.Context) {
	e.t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount}}
	if _, err := e.Client.CoreV1().ServiceAccounts(e.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating ServiceAccount %s: %v", serviceAccount, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: serviceAccount + "-executor"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: manifests.ExecutorClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccount, Namespace: e.Namespace}},
	}
	if _, err := e.Client.RbacV1().RoleBindings(e.Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("binding %s to ServiceAccount %s: %v", manifests.ExecutorClusterRole, serviceAccount, err)
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

// cacheClaimTemplate is a Workflow's volumeClaimTemplates entry named
// cache, annotated with the cache (and any further annotations), as an
// Argo user adds layercache to a Workflow.
func cacheClaimTemplate(cache string, annotations ...string) map[string]any {
	ann := map[string]any{v1alpha1.AnnotationCache: cache}
	for i := 0; i+1 < len(annotations); i += 2 {
		ann[annotations[i]] = annotations[i+1]
	}
	return map[string]any{
		"metadata": map[string]any{"name": "cache", "annotations": ann},
		"spec": map[string]any{
			"storageClassName": storageClass,
			"accessModes":      []any{"ReadWriteOnce"},
			"resources":        map[string]any{"requests": map[string]any{"storage": "1Gi"}},
		},
	}
}

// withClaimTemplate adds a volumeClaimTemplates entry to a Workflow.
func withClaimTemplate(wf *unstructured.Unstructured, tmpl map[string]any) {
	list, _, _ := unstructured.NestedSlice(wf.Object, "spec", "volumeClaimTemplates")
	if err := unstructured.SetNestedSlice(wf.Object, append(list, tmpl), "spec", "volumeClaimTemplates"); err != nil {
		panic(err) // a test's own literal
	}
}

// withVolume adds a pod volume to a Workflow.
func withVolume(wf *unstructured.Unstructured, volume map[string]any) {
	list, _, _ := unstructured.NestedSlice(wf.Object, "spec", "volumes")
	if err := unstructured.SetNestedSlice(wf.Object, append(list, volume), "spec", "volumes"); err != nil {
		panic(err) // a test's own literal
	}
}

// workflow is a finished Workflow.
type workflow struct {
	Obj     *unstructured.Unstructured
	Phase   string
	Message string
}

func (w workflow) Succeeded() bool { return w.Phase == "Succeeded" }

// run submits wf and waits until it is done.
func (e *env) run(ctx context.Context, wf *unstructured.Unstructured) workflow {
	e.t.Helper()
	if _, err := e.Dyn.Resource(workflowsGVR).Namespace(e.Namespace).Create(ctx, wf, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating Workflow %s: %v", wf.GetName(), err)
	}
	name := wf.GetName()
	var last *unstructured.Unstructured
	var w workflow
	err := wait.PollUntilContextTimeout(ctx, pollInterval, workflowTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := e.Dyn.Resource(workflowsGVR).Namespace(e.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = u
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		switch phase {
		case "Succeeded", "Failed", "Error":
			msg, _, _ := unstructured.NestedString(u.Object, "status", "message")
			w = workflow{Obj: u, Phase: phase, Message: msg}
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		var status any
		if last != nil {
			status = last.Object["status"]
		}
		e.t.Fatalf("Workflow %s did not finish within %s: %v; status: %v", name, workflowTimeout, err, status)
	}
	e.t.Logf("Workflow %s: %s %s", name, w.Phase, w.Message)
	return w
}

// outputs returns the output parameters of the Workflow's node that ran
// template.
func (e *env) outputs(w workflow, template string) map[string]string {
	e.t.Helper()
	nodes, _, _ := unstructured.NestedMap(w.Obj.Object, "status", "nodes")
	for _, n := range nodes {
		node, _ := n.(map[string]any)
		if node["templateName"] != template || node["type"] != "Pod" {
			continue
		}
		out := map[string]string{}
		params, _, _ := unstructured.NestedSlice(node, "outputs", "parameters")
		for _, p := range params {
			pm, _ := p.(map[string]any)
			out[fmt.Sprint(pm["name"])] = fmt.Sprint(pm["value"])
		}
		return out
	}
	e.t.Fatalf("Workflow %s has no pod node of template %s", w.Obj.GetName(), template)
	return nil
}

// seconds parses an output parameter that holds a duration in seconds.
func (e *env) seconds(w workflow, outputs map[string]string, name string) time.Duration {
	e.t.Helper()
	v, err := strconv.ParseFloat(outputs[name], 64)
	if err != nil {
		e.t.Fatalf("Workflow %s: output %s = %q is not a number of seconds (outputs %v)", w.Obj.GetName(), name, outputs[name], outputs)
	}
	return time.Duration(v * float64(time.Second))
}

// claimName is the name Argo gives the claim of a Workflow's
// volumeClaimTemplates entry (workflow/controller/operator.go createPVCs).
func claimName(workflow, template string) string { return workflow + "-" + template }

// claim returns the claim name, or nil once it is gone.
func (e *env) claim(ctx context.Context, name string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	c, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatalf("getting claim %s: %v", name, err)
	}
	return c
}

// waitClaimGone waits until Argo (or the garbage collector) has deleted
// the claim name, finalizers and all.
func (e *env) waitClaimGone(ctx context.Context, name string) {
	e.t.Helper()
	var last *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(ctx, pollInterval, framework.VolumeTimeout, true, func(ctx context.Context) (bool, error) {
		last = e.claim(ctx, name)
		return last == nil, nil
	})
	if err != nil {
		e.t.Fatalf("claim %s still exists after %s: deletion %v, finalizers %v", name, framework.VolumeTimeout, last.DeletionTimestamp, last.Finalizers)
	}
}

// deleteWorkflow deletes a Workflow the way users and Argo's TTL do
// (background propagation: the claims it owns go with it).
func (e *env) deleteWorkflow(ctx context.Context, name string) {
	e.t.Helper()
	bg := metav1.DeletePropagationBackground
	if err := e.Dyn.Resource(workflowsGVR).Namespace(e.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		e.t.Fatalf("deleting Workflow %s: %v", name, err)
	}
}

// expectPodOutcome checks the pods' outcome that the manager wrote on the
// last state of a volume's PV before it released the claim. A standalone
// claim's volume ends when its PV is released (the provisioner's Delete),
// so the result is the Committed or Discarded Event on the PV, not the
// annotation layercache.dev/result, which the node agent writes on the PVs
// of pod-owned claims only (nodeagent/volumes/podwatch.go, record).
func (e *env) expectPodOutcome(pvs *framework.PVWatch, pv, outcome string) {
	e.t.Helper()
	last := pvs.Last(pv)
	if last == nil {
		e.t.Fatalf("PV %s was never seen", pv)
	}
	if got := last.Annotations[v1alpha1.AnnotationPodOutcome]; got != outcome {
		e.t.Errorf("PV %s: %s=%q, want %q (annotations %v)", pv, v1alpha1.AnnotationPodOutcome, got, outcome, last.Annotations)
	}
}

// waitFor polls cond until it holds, at most framework.VolumeTimeout.
func waitFor(ctx context.Context, cond func() bool) error {
	return wait.PollUntilContextTimeout(ctx, pollInterval, framework.VolumeTimeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
}

// settleFor waits d unless ctx ends first.
func (e *env) settleFor(ctx context.Context, d time.Duration) {
	e.t.Helper()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		e.t.Fatal(ctx.Err())
	}
}
