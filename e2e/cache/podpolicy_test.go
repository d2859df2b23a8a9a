//go:build e2e

package cache

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// TestNodeAgentPodPolicy checks, on the real API server, what the
// ClusterRoles and ValidatingAdmissionPolicy layercache-node-pods let
// layercache do to a pod: the node agent adds and removes its finalizer
// on pods of its own node, the manager lifts it, and neither changes
// anything else. It acts as their service accounts, the agent's with the
// node its token names.
func TestNodeAgentPodPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	pod := framework.BusyboxPod("target", "sleep", "3600")
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: e.Node.Name}
	pod.Spec.TerminationGracePeriodSeconds = new(int64)
	if _, err := e.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitForPodPhase(ctx, "target", corev1.PodRunning); err != nil {
		t.Fatal(err)
	}
	as := func(account, node string) kubernetes.Interface {
		return kubernetes.NewForConfigOrDie(e.AsLayercache(account, node))
	}
	const agent, manager = "layercache-node", "layercache-manager"
	finalizer := func(op string) string {
		return fmt.Sprintf(`{"metadata":{%q:[%q]}}`, op, v1alpha1.FinalizerBuildEnd)
	}
	tests := []struct {
		name          string
		account, node string
		patch         string
		allowed       bool
	}{
		{"the agent adds its finalizer", agent, e.Node.Name, finalizer("finalizers"), true},
		{"the agent removes its finalizer", agent, e.Node.Name, finalizer("$deleteFromPrimitiveList/finalizers"), true},
		{"the agent adds its finalizer to another node's pod", agent, "some-other-node", finalizer("finalizers"), false},
		{"the agent adds another finalizer", agent, e.Node.Name, `{"metadata":{"finalizers":["example.com/other"]}}`, false},
		{"the agent changes a label", agent, e.Node.Name, `{"metadata":{"labels":{"app":"changed"}}}`, false},
		{"the agent changes an annotation", agent, e.Node.Name, `{"metadata":{"annotations":{"note":"changed"}}}`, false},
		{"the agent changes the image", agent, e.Node.Name, `{"spec":{"containers":[{"name":"main","image":"localhost/pause:e2e"}]}}`, false},
		{"the agent adds its finalizer again", agent, e.Node.Name, finalizer("finalizers"), true},
		{"the manager lifts the finalizer", manager, "", finalizer("$deleteFromPrimitiveList/finalizers"), true},
		{"the manager changes a label", manager, "", `{"metadata":{"labels":{"app":"changed"}}}`, false},
	}
	for _, tt := range tests {
		_, err := as(tt.account, tt.node).CoreV1().Pods(e.Namespace).Patch(ctx, "target", types.StrategicMergePatchType, []byte(tt.patch), metav1.PatchOptions{})
		wantAdmission(t, tt.name, tt.allowed, err)
	}
}

// TestNodeAgentReplicaPolicy checks, on the real API server, that
// ValidatingAdmissionPolicy layercache-node-replicas keeps a node agent to
// its own node's CacheReplicas: it writes and deletes those, and neither
// creates, changes nor deletes another node's.
func TestNodeAgentReplicaPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	c := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: "policy"}}
	if err := e.Caches.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	// A Node no agent runs on (the manager deletes the replicas of Nodes
	// that do not exist); unschedulable, so that no pod lands there.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.Namespace + "-policy"}, Spec: corev1.NodeSpec{Unschedulable: true}}
	if _, err := e.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting Node %s: %v", node.Name, err)
		}
	})
	agentOn := func(node string) client.Client { return e.clientFor(e.AsLayercache("layercache-node", node)) }
	apply := func(as client.Client, node string, gen int64) error {
		b := v1alpha1.CacheReplicaApply(c.Namespace, c.Name, c.UID, node, v1alpha1.CacheReplicaStatus{Generation: gen})
		return as.Apply(ctx, b, client.FieldOwner("layercache-node-"+node), client.ForceOwnership)
	}
	remove := func(as client.Client, node string) error {
		return as.Delete(ctx, &v1alpha1.CacheReplica{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: v1alpha1.CacheReplicaName(c.Name, node)}})
	}
	mine, other := agentOn(node.Name), agentOn("some-other-node")
	tests := []struct {
		name    string
		do      func() error
		allowed bool
	}{
		{"an agent creates its node's replica", func() error { return apply(mine, node.Name, 1) }, true},
		{"an agent updates its node's replica", func() error { return apply(mine, node.Name, 2) }, true},
		{"an agent overwrites another node's replica", func() error { return apply(other, node.Name, 3) }, false},
		{"an agent deletes another node's replica", func() error { return remove(other, node.Name) }, false},
		{"an agent deletes its node's replica", func() error { return remove(mine, node.Name) }, true},
		{"an agent speaks for another node", func() error { return apply(mine, "some-other-node", 1) }, false},
	}
	for _, tt := range tests {
		wantAdmission(t, tt.name, tt.allowed, tt.do())
	}
}

// wantAdmission checks that a request was allowed, or refused by an
// admission policy (Invalid) or RBAC (Forbidden), as allowed says.
func wantAdmission(t *testing.T, name string, allowed bool, err error) {
	t.Helper()
	switch {
	case allowed && err != nil:
		t.Errorf("%s: %v, want it allowed", name, err)
	case !allowed && err == nil:
		t.Errorf("%s: allowed, want it refused by the policy", name)
	case !allowed && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err):
		t.Errorf("%s: %v, want the policy's refusal", name, err)
	case !allowed:
		t.Logf("%s: refused: %v", name, err)
	}
}
