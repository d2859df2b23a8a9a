//go:build e2e && multinode

package multinode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
	"github.com/layercache/layercache/internal/bootstrap"
)

// Bounds of the waits of the sync scenarios.
const (
	scenarioTimeout = 8 * time.Minute
	// publishTimeout bounds a commit's way into the registry and the
	// Cache's chain; after an outage the agent's retries back off up to a
	// minute, and its resync pass retries every minute.
	publishTimeout = 3 * time.Minute
	eventTimeout   = 2 * time.Minute
	pollInterval   = 500 * time.Millisecond
	mountPath      = "/cache"
)

// syncEnv is a scenario on two nodes that share a cache via the registry.
type syncEnv struct {
	*framework.Framework
	Caches client.Client
	Reg    *framework.Registry
	t      *testing.T
}

func newSyncEnv(t *testing.T) *syncEnv {
	t.Helper()
	f := framework.NewAcrossNodes(t)
	if len(f.Cluster.Nodes) < 2 || f.Cluster.Registry == nil {
		t.Fatalf("needs two nodes and the registry (cluster.json has %d nodes, registry %v): start the cluster with `make up NODES=2`",
			len(f.Cluster.Nodes), f.Cluster.Registry != nil)
	}
	scheme, err := bootstrap.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(f.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &syncEnv{Framework: f, Caches: c, Reg: f.Cluster.Registry, t: t}
}

// node returns the name of node i (0 or 1).
func (e *syncEnv) node(i int) string { return e.Cluster.Nodes[i].Name }

// buildPod runs script on node with cache at /cache, from a claim of
// class (the registry's class unless given).
func (e *syncEnv) buildPod(name, node, cache, class, script string) *corev1.Pod {
	if class == "" {
		class = e.Reg.StorageClass
	}
	pod := framework.BusyboxPod(name, "sh", "-c", "set -e; "+script)
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	pod.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
		Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationCache: cache}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &class,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceStorage: resource.MustParse("2Gi"),
				}},
			},
		}},
	}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: mountPath}}
	return pod
}

// run creates pod and waits until it succeeded, returning its log.
func (e *syncEnv) run(ctx context.Context, pod *corev1.Pod) string {
	e.t.Helper()
	if _, err := e.CreatePod(ctx, pod); err != nil {
		e.t.Fatal(err)
	}
	return e.waitSucceeded(ctx, pod.Name)
}

// buildTimeout bounds a build pod (BuildKit, a cold Go build) from its
// creation to its end, as e2e/imagebuild's buildTimeout does: beside the
// other e2e packages such builds outlasted the framework's pod bound of
// 3 minutes in CI rehearsals (seconds, and about a minute, alone).
const buildTimeout = 6 * time.Minute

// runBuild is run for a build pod: its wait is buildTimeout, not the
// framework's pod bound.
func (e *syncEnv) runBuild(ctx context.Context, pod *corev1.Pod) string {
	e.t.Helper()
	if _, err := e.CreatePod(ctx, pod); err != nil {
		e.t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, buildTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("pod %s failed", pod.Name)
		}
		return p.Status.Phase == corev1.PodSucceeded, nil
	})
	out, logErr := e.PodLogs(ctx, pod.Name, "main")
	if err != nil {
		e.t.Fatalf("build pod %s did not succeed within %s: %v (log: %v)\n%s", pod.Name, buildTimeout, err, logErr, out)
	}
	return out
}

func (e *syncEnv) waitSucceeded(ctx context.Context, name string) string {
	e.t.Helper()
	if _, err := e.WaitForPodPhase(ctx, name, corev1.PodSucceeded); err != nil {
		e.t.Fatal(err)
	}
	out, err := e.PodLogs(ctx, name, "main")
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// cache reads Cache name of the scenario's namespace.
func (e *syncEnv) cache(ctx context.Context, name string) (*v1alpha1.Cache, error) {
	var c v1alpha1.Cache
	err := e.Caches.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: name}, &c)
	return &c, err
}

// waitCache polls Cache name until ok accepts it, and returns it.
func (e *syncEnv) waitCache(ctx context.Context, name string, timeout time.Duration, what string, ok func(*v1alpha1.Cache) bool) *v1alpha1.Cache {
	e.t.Helper()
	var last *v1alpha1.Cache
	err := wait.PollUntilContextTimeout(ctx, pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		c, err := e.cache(ctx, name)
		if err != nil {
			return false, nil
		}
		last = c
		return ok(c), nil
	})
	if err != nil {
		e.t.Fatalf("Cache %s/%s: %s did not happen within %s: %v; last status %+v", e.Namespace, name, what, timeout, err, statusOf(last))
	}
	return last
}

// waitPublished waits until the Cache's chain reaches generation gen.
func (e *syncEnv) waitPublished(ctx context.Context, name string, gen int64) *v1alpha1.Cache {
	e.t.Helper()
	return e.waitCache(ctx, name, publishTimeout, fmt.Sprintf("publication of generation %d", gen), func(c *v1alpha1.Cache) bool {
		return c.Status.Published != nil && c.Status.Published.Generation >= gen
	})
}

func statusOf(c *v1alpha1.Cache) any {
	if c == nil {
		return nil
	}
	return c.Status
}

// nodeEntry is the status of node's CacheReplica of c, or nil.
func (e *syncEnv) nodeEntry(c *v1alpha1.Cache, node string) *v1alpha1.CacheReplicaStatus {
	var r v1alpha1.CacheReplica
	key := client.ObjectKey{Namespace: c.Namespace, Name: v1alpha1.CacheReplicaName(c.Name, node)}
	if err := e.Caches.Get(e.t.Context(), key, &r); err != nil {
		return nil
	}
	return &r.Status
}

// waitEvent waits for an Event about the Cache or a claim of the scenario
// whose reason is reason and whose message contains every part.
func (e *syncEnv) waitEvent(ctx context.Context, kind, name, reason string, parts ...string) *corev1.Event {
	e.t.Helper()
	var found *corev1.Event
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, eventTimeout, true, func(ctx context.Context) (bool, error) {
		selector := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name}.AsSelector().String()
		list, err := e.Client.CoreV1().Events(e.Namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for i := range list.Items {
			ev := &list.Items[i]
			seen = append(seen, ev.Reason+": "+ev.Message)
			if ev.Reason == reason && containsAll(ev.Message, parts) {
				found = ev
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("no %s Event about %s %s/%s containing %q within %s: %v; seen %q", reason, kind, e.Namespace, name, parts, eventTimeout, err, seen)
	}
	return found
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
