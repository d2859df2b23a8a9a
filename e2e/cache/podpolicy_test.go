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
	"k8s.io/client-go/rest"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// TestNodeAgentPodPolicy checks, on the real API server, what the node
// agent's ClusterRole and ValidatingAdmissionPolicy layercache-node-pods
// let it do to a pod: add and remove its finalizer on pods of its own
// node, and nothing else. It acts as the agent's service account, with
// the node its token names.
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
	agentOf := func(node string) kubernetes.Interface {
		cfg := rest.CopyConfig(e.Config)
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:" + framework.SystemNamespace + ":layercache-node",
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + framework.SystemNamespace, "system:authenticated"},
			Extra:    map[string][]string{"authentication.kubernetes.io/node-name": {node}},
		}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	finalizer := func(op string) string {
		return fmt.Sprintf(`{"metadata":{%q:[%q]}}`, op, v1alpha1.FinalizerBuildEnd)
	}
	tests := []struct {
		name    string
		node    string
		patch   string
		allowed bool
	}{
		{"add its finalizer", e.Node.Name, finalizer("finalizers"), true},
		{"remove its finalizer", e.Node.Name, finalizer("$deleteFromPrimitiveList/finalizers"), true},
		{"add its finalizer to another node's pod", "some-other-node", finalizer("finalizers"), false},
		{"add another finalizer", e.Node.Name, `{"metadata":{"finalizers":["example.com/other"]}}`, false},
		{"change a label", e.Node.Name, `{"metadata":{"labels":{"app":"changed"}}}`, false},
		{"change an annotation", e.Node.Name, `{"metadata":{"annotations":{"note":"changed"}}}`, false},
		{"change the image", e.Node.Name, `{"spec":{"containers":[{"name":"main","image":"localhost/pause:e2e"}]}}`, false},
	}
	for _, tt := range tests {
		_, err := agentOf(tt.node).CoreV1().Pods(e.Namespace).Patch(ctx, "target", types.StrategicMergePatchType, []byte(tt.patch), metav1.PatchOptions{})
		switch {
		case tt.allowed && err != nil:
			t.Errorf("%s: %v, want it allowed", tt.name, err)
		case !tt.allowed && err == nil:
			t.Errorf("%s: allowed, want it refused by the policy", tt.name)
		case !tt.allowed && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err):
			t.Errorf("%s: %v, want the policy's refusal", tt.name, err)
		case !tt.allowed:
			t.Logf("%s: refused: %v", tt.name, err)
		}
	}
}
