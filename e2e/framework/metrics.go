package framework

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Components of layercache, as the label app.kubernetes.io/component of
// their pods in SystemNamespace says.
const (
	ComponentNode    = "node"
	ComponentManager = "manager"
)

// ComponentMetrics reads the Prometheus /metrics page of every running
// layercache pod of component (ComponentNode or ComponentManager) through
// the API server's pod proxy, on the container port named metrics, as
// e2e/bench does. A non-empty node keeps the pods on that node. It
// returns the pages by pod name, and an error if no pod could be read: a
// figure read from nothing would go unnoticed.
func (f *Framework) ComponentMetrics(ctx context.Context, component, node string) (map[string]string, error) {
	pods, err := f.Client.CoreV1().Pods(SystemNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=layercache,app.kubernetes.io/component=" + component,
	})
	if err != nil {
		return nil, fmt.Errorf("listing the %s pods in %s: %w", component, SystemNamespace, err)
	}
	pages := map[string]string{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || (node != "" && p.Spec.NodeName != node) {
			continue
		}
		port := metricsPort(&p)
		if port == 0 {
			return nil, fmt.Errorf("pod %s declares no container port named metrics (the multi-node overlay turns the node agents' metrics off)", p.Name)
		}
		raw, err := f.Client.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, strconv.Itoa(int(port)), "metrics", nil).DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the metrics of pod %s on port %d through the API server: %w", p.Name, port, err)
		}
		pages[p.Name] = string(raw)
	}
	if len(pages) == 0 {
		where := ""
		if node != "" {
			where = " on node " + node
		}
		return nil, fmt.Errorf("no running %s pod in %s%s", component, SystemNamespace, where)
	}
	return pages, nil
}

// metricsPort is the container port named metrics; 0 if there is none.
func metricsPort(p *corev1.Pod) int32 {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "metrics" {
				return port.ContainerPort
			}
		}
	}
	return 0
}
