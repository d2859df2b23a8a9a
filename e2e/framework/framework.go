// Package framework gives e2e tests a client for the cluster that
// e2e/cluster/up.sh started (KUBECONFIG), a namespace of their own that is
// removed after the test, and bounded helpers for pods, logs, exec and the
// nodes' filesystems.
//
// A test starts with
//
//	f := framework.New(t)
//
// and everything it creates in f.Namespace is deleted when it ends. When a
// test fails, the namespace's pods, their logs and events are written to
// the test log first.
package framework

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
)

// Images loaded into every node by the harness. Pods must use
// imagePullPolicy Never: the cluster has no registry.
const (
	ImageBusybox    = "localhost/busybox:e2e"
	ImageLayercache = "localhost/layercache:dev"
	// SystemNamespace is where config/e2e deploys layercache.
	SystemNamespace = "layercache-system"
	// E2ELabel marks the namespaces the framework creates.
	E2ELabel = "layercache.dev/e2e"
)

// Timeouts for the waits the helpers do. Every wait is also bounded by the
// context the caller passes.
const (
	PodStartTimeout  = 3 * time.Minute
	NamespaceTimeout = 2 * time.Minute
	pollInterval     = 250 * time.Millisecond
)

// Framework is one test's handle on the cluster.
type Framework struct {
	Config    *rest.Config
	Client    kubernetes.Interface
	Namespace string
	Cluster   *Cluster
	t         testing.TB
}

// NodeSelectorAnnotation is the PodNodeSelector admission plugin's
// namespace annotation: every pod of the namespace gets its node selector.
const NodeSelectorAnnotation = "scheduler.alpha.kubernetes.io/node-selector"

// New connects to the cluster named by KUBECONFIG, creates a fresh
// namespace for the test and registers its removal. It fails the test if
// there is no cluster. On a cluster of more than one node the namespace's
// pods (those Tekton, Argo and Jobs create too) all run on the first node,
// where the one-node scenarios look: they share the cluster with the
// two-node ones (NewAcrossNodes).
func New(t testing.TB) *Framework {
	t.Helper()
	return newFramework(t, true)
}

// NewAcrossNodes is New for a scenario that places its pods on nodes
// itself: its namespace's pods may run on any node.
func NewAcrossNodes(t testing.TB) *Framework {
	t.Helper()
	return newFramework(t, false)
}

func newFramework(t testing.TB, firstNodeOnly bool) *Framework {
	t.Helper()
	cfg, err := RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client for %s: %v", cfg.Host, err)
	}
	cluster, err := LoadCluster()
	if err != nil {
		t.Fatal(err)
	}
	f := &Framework{Config: cfg, Client: client, Cluster: cluster, t: t}

	ctx, cancel := context.WithTimeout(context.Background(), NamespaceTimeout)
	defer cancel()
	meta := metav1.ObjectMeta{
		GenerateName: namespacePrefix(t.Name()),
		// The scenarios' namespaces are CI namespaces an admin opted in
		// to CSI inline volumes.
		Labels: map[string]string{E2ELabel: "true", v1alpha1.LabelCSI: v1alpha1.CSIEnabled},
	}
	if firstNodeOnly && len(cluster.Nodes) > 1 {
		meta.Annotations = map[string]string{NodeSelectorAnnotation: corev1.LabelHostname + "=" + cluster.Nodes[0].Name}
	}
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: meta}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the test namespace (is the cluster up? `make up`): %v", err)
	}
	f.Namespace = ns.Name
	t.Cleanup(f.cleanup)
	t.Logf("namespace %s", f.Namespace)

	// Pods are refused until the namespace's default ServiceAccount exists.
	err = wait.PollUntilContextTimeout(ctx, pollInterval, NamespaceTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(f.Namespace).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("namespace %s: default ServiceAccount did not appear (is kube-controller-manager running?): %v", f.Namespace, err)
	}
	return f
}

// RESTConfig reads the kubeconfig that KUBECONFIG names.
func RESTConfig() (*rest.Config, error) {
	path := os.Getenv("KUBECONFIG")
	if path == "" {
		return nil, fmt.Errorf("KUBECONFIG is not set: start a cluster with `make up` and run the suite with `make e2e` (or export KUBECONFIG=_output/cluster/kubeconfig)")
	}
	cfg, err := bootstrap.RESTConfig(path, "layercache-e2e")
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// namespacePrefix turns a test name into a readable namespace prefix.
func namespacePrefix(testName string) string {
	s := nonName.ReplaceAllString(strings.ToLower(testName), "-")
	s = strings.Trim(s, "-")
	if len(s) > 40 {
		s = strings.TrimRight(s[:40], "-")
	}
	return "e2e-" + s + "-"
}

func (f *Framework) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), NamespaceTimeout)
	defer cancel()
	if f.t.Failed() {
		f.DumpNamespace(ctx)
	}
	if os.Getenv("E2E_KEEP_NAMESPACES") != "" {
		f.t.Logf("keeping namespace %s (E2E_KEEP_NAMESPACES is set)", f.Namespace)
		return
	}
	if err := DeleteNamespace(ctx, f.Client, f.Namespace); err != nil {
		f.t.Errorf("cleanup: %v", err)
	}
}

// DeleteNamespace deletes a namespace and waits until it is gone, so that
// the next test does not share the node with this one's pods.
func DeleteNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	policy := metav1.DeletePropagationForeground
	err := client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &policy})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting namespace %s: %w", name, err)
	}
	err = wait.PollUntilContextTimeout(ctx, pollInterval, NamespaceTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		return fmt.Errorf("namespace %s was not removed within %s: %w", name, NamespaceTimeout, err)
	}
	return nil
}

// DumpNamespace writes the namespace's pods, their container logs and its
// events to the test log: what one needs to see why a test failed.
func (f *Framework) DumpNamespace(ctx context.Context) {
	pods, err := f.Client.CoreV1().Pods(f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Logf("dump: listing pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		f.t.Logf("pod %s: phase %s on node %q", p.Name, p.Status.Phase, p.Spec.NodeName)
		for _, c := range p.Status.Conditions {
			f.t.Logf("  condition %s=%s since %s %s", c.Type, c.Status, c.LastTransitionTime.UTC().Format(time.RFC3339), c.Message)
		}
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			f.t.Logf("  container %s: %s", cs.Name, describeState(cs.State))
			logs, err := f.PodLogs(ctx, p.Name, cs.Name)
			if err != nil {
				f.t.Logf("  logs: %v", err)
				continue
			}
			for line := range strings.Lines(logs) {
				f.t.Logf("  | %s", strings.TrimRight(line, "\n"))
			}
		}
	}
	events, err := f.Client.CoreV1().Events(f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Logf("dump: listing events: %v", err)
		return
	}
	for _, e := range events.Items {
		f.t.Logf("event %s/%s: %s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
	}
}

func describeState(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.Format(time.RFC3339)
	case s.Terminated != nil:
		return fmt.Sprintf("terminated: exit %d, reason %s %s", s.Terminated.ExitCode, s.Terminated.Reason, s.Terminated.Message)
	case s.Waiting != nil:
		return fmt.Sprintf("waiting: %s %s", s.Waiting.Reason, s.Waiting.Message)
	}
	return "unknown"
}
