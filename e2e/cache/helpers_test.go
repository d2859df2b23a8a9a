//go:build e2e

// Package cache holds the e2e scenarios of cache volumes: build pods that
// name a cache through a generic ephemeral volume of class layercache, run
// on a real node, and leave their changes to the next pod (or not, as the
// commit policy, the mode and the pod's outcome say). One file per
// scenario; the helpers below build on e2e/framework.
//
// Every pod runs on the cluster's first node: a cache lives on the node
// that mounts it, so a scenario that compares generations needs one node.
package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
	"github.com/layercache/layercache/internal/bootstrap"
)

// Bounds of the waits below; each is also bounded by the test's context.
const (
	// scenarioTimeout bounds one scenario, pods and cleanup included.
	scenarioTimeout = 6 * time.Minute
	// volumeTimeout bounds the way from a pod's end to its volume being
	// committed or discarded by the node agent.
	volumeTimeout = 2 * time.Minute
	// statusTimeout bounds the node agent's status report and the
	// manager's derived fields after a commit.
	statusTimeout = time.Minute
	// eventTimeout bounds the wait for an Event the node agent records.
	eventTimeout = time.Minute
	pollInterval = 250 * time.Millisecond

	// volumeName is the pod volume of the cache; its generic ephemeral
	// claim is called <pod>-cache.
	volumeName = "cache"
	mountPath  = "/cache"
)

// env is one scenario's handle: the framework's namespace and clients, a
// client for Cache resources, the node the scenario's pods run on, and a
// record of the PVs of the namespace's claims.
type env struct {
	*framework.Framework
	// Caches reads and writes layercache.dev resources.
	Caches client.Client
	// Node runs every pod of the scenario.
	Node framework.Node
	pvs  *pvTracker
	t    testing.TB
}

func newEnv(t *testing.T) *env {
	t.Helper()
	f := framework.New(t)
	scheme, err := bootstrap.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(f.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("client for Cache resources: %v", err)
	}
	e := &env{Framework: f, Caches: c, Node: f.Cluster.Nodes[0], t: t}
	e.pvs = trackPVs(t, e)
	return e
}

// pvTracker remembers the layercache PVs of one namespace's claims, even
// after they are deleted: a short-lived pod's PV often comes and goes
// between two polls.
type pvTracker struct {
	mu      sync.Mutex
	byClaim map[string]*corev1.PersistentVolume
	deleted map[string]bool // PV names
}

// trackPVs watches the PVs node agents make (they carry the node label)
// until the test ends. It starts before the scenario creates any claim.
func trackPVs(t *testing.T, e *env) *pvTracker {
	t.Helper()
	tr := &pvTracker{byClaim: map[string]*corev1.PersistentVolume{}, deleted: map[string]bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(e.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.AnnotationNode }))
	informer := factory.Core().V1().PersistentVolumes().Informer()
	record := func(obj any) {
		pv, ok := obj.(*corev1.PersistentVolume)
		if !ok || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != e.Namespace {
			return
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.byClaim[pv.Spec.ClaimRef.Name] = pv.DeepCopy()
	}
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			record(obj)
			if pv, ok := obj.(*corev1.PersistentVolume); ok {
				tr.mu.Lock()
				tr.deleted[pv.Name] = true
				tr.mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	factory.Start(stop)
	for typ, ok := range factory.WaitForCacheSync(stop) {
		if !ok {
			t.Fatalf("syncing the %v informer failed", typ)
		}
	}
	return tr
}

// get returns the last seen PV of a claim and whether it has been deleted.
func (tr *pvTracker) get(claim string) (*corev1.PersistentVolume, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	pv := tr.byClaim[claim]
	if pv == nil {
		return nil, false
	}
	return pv.DeepCopy(), tr.deleted[pv.Name]
}

// claimName is the name of a pod's generic ephemeral cache claim.
func claimName(pod string) string { return pod + "-" + volumeName }

// cacheAnnotations returns claim annotations that name cache, plus the
// given key-value pairs.
func cacheAnnotations(cache string, kv ...string) map[string]string {
	ann := map[string]string{v1alpha1.AnnotationCache: cache}
	for i := 0; i+1 < len(kv); i += 2 {
		ann[kv[i]] = kv[i+1]
	}
	return ann
}

// cacheVolume is a generic ephemeral volume of class layercache whose
// claim carries annotations, as a build pod asks for its cache.
func cacheVolume(annotations map[string]string) corev1.Volume {
	return corev1.Volume{Name: volumeName, VolumeSource: corev1.VolumeSource{
		Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Annotations: annotations},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: new(v1alpha1.StorageClassName),
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceStorage: resource.MustParse("1Gi"),
				}},
			},
		}},
	}}
}

// cachePod is a busybox pod on the scenario's node that runs script with
// its cache volume (annotations as given) at /cache.
func (e *env) cachePod(name string, annotations map[string]string, script string) *corev1.Pod {
	pod := framework.BusyboxPod(name, "sh", "-c", script)
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: e.Node.Name}
	pod.Spec.Volumes = []corev1.Volume{cacheVolume(annotations)}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: volumeName, MountPath: mountPath}}
	return pod
}

// runPod creates pod and waits until it reaches phase.
func (e *env) runPod(ctx context.Context, pod *corev1.Pod, phase corev1.PodPhase) *corev1.Pod {
	e.t.Helper()
	if _, err := e.CreatePod(ctx, pod); err != nil {
		e.t.Fatal(err)
	}
	p, err := e.WaitForPodPhase(ctx, pod.Name, phase)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// logs returns a container's logs or fails the test.
func (e *env) logs(ctx context.Context, pod string) string {
	e.t.Helper()
	out, err := e.PodLogs(ctx, pod, "main")
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// exec runs a shell command in a running pod or fails the test.
func (e *env) exec(ctx context.Context, pod, script string) string {
	e.t.Helper()
	out, _, err := e.Exec(ctx, pod, "main", "sh", "-c", script)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// cacheJob is a Job of one attempt whose pod is cachePod.
func (e *env) cacheJob(name string, annotations map[string]string, script string) *batchv1.Job {
	pod := e.cachePod(name, annotations, script)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.Namespace},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32(0)),
			Template:     corev1.PodTemplateSpec{Spec: pod.Spec},
		},
	}
}

// runJob creates job, waits until it completes and returns its pod.
func (e *env) runJob(ctx context.Context, job *batchv1.Job) *corev1.Pod {
	e.t.Helper()
	jobs := e.Client.BatchV1().Jobs(e.Namespace)
	if _, err := jobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating Job %s/%s: %v", e.Namespace, job.Name, err)
	}
	var last *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, pollInterval, framework.PodStartTimeout, true, func(ctx context.Context) (bool, error) {
		j, err := jobs.Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = j
		if j.Status.Failed > 0 {
			return false, fmt.Errorf("Job failed: %+v", j.Status.Conditions)
		}
		return j.Status.Succeeded > 0, nil
	})
	if err != nil {
		status := "never seen"
		if last != nil {
			status = fmt.Sprintf("%+v", last.Status)
		}
		e.t.Fatalf("Job %s/%s did not complete: %v (last status: %s)", e.Namespace, job.Name, err, status)
	}
	pods, err := e.Client.CoreV1().Pods(e.Namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job.Name})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		e.t.Fatalf("Job %s has %d pods, want 1", job.Name, len(pods.Items))
	}
	return &pods.Items[0]
}

// waitJobGone waits until Job name and its pods are deleted.
func (e *env) waitJobGone(ctx context.Context, name string) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(ctx, pollInterval, framework.NamespaceTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.BatchV1().Jobs(e.Namespace).Get(ctx, name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, client.IgnoreNotFound(err)
		}
		pods, err := e.Client.CoreV1().Pods(e.Namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
		return err == nil && len(pods.Items) == 0, err
	})
	if err != nil {
		e.t.Fatalf("Job %s/%s was not deleted within %s: %v", e.Namespace, name, framework.NamespaceTimeout, err)
	}
}

// volume waits until the claim of pod has a PV and returns it.
func (e *env) volume(ctx context.Context, pod string) *corev1.PersistentVolume {
	e.t.Helper()
	return e.claimVolume(ctx, claimName(pod))
}

// claimVolume waits until claim has a PV and returns it.
func (e *env) claimVolume(ctx context.Context, claim string) *corev1.PersistentVolume {
	e.t.Helper()
	var pv *corev1.PersistentVolume
	err := wait.PollUntilContextTimeout(ctx, pollInterval, volumeTimeout, true, func(context.Context) (bool, error) {
		pv, _ = e.pvs.get(claim)
		return pv != nil, nil
	})
	if err != nil {
		e.t.Fatalf("claim %s/%s got no PV: %v", e.Namespace, claim, err)
	}
	return pv
}

// volumeEnd is what became of a volume whose build ended.
type volumeEnd struct {
	PV     *corev1.PersistentVolume // as last seen, with the node agent's record
	Reason string                   // Committed, Discarded or CommitDropped
	Event  string
}

// endReasons are the Event reasons of a volume's end, by the result the
// node agent records on the PV.
var endReasons = map[string]string{
	"Committed":     v1alpha1.ResultCommitted,
	"Discarded":     v1alpha1.ResultDiscarded,
	"CommitDropped": v1alpha1.ResultDropped,
}

// expectVolumeEnd waits until the node agent has committed or discarded
// the volume of pod, checks that it ended as want (an Event reason), and
// returns the end.
func (e *env) expectVolumeEnd(ctx context.Context, pod, want string) volumeEnd {
	e.t.Helper()
	return e.expectClaimEnd(ctx, claimName(pod), want)
}

// expectClaimEnd is expectVolumeEnd for the volume of claim. A pod's
// volume ends when the pod ends: the agent records the result on the PV,
// which stays bound, and tells the claim. A volume whose claim went first
// ends when its PV is released and deleted, told on the PV.
func (e *env) expectClaimEnd(ctx context.Context, claim, want string) volumeEnd {
	e.t.Helper()
	pv := e.claimVolume(ctx, claim)
	var deleted bool
	err := wait.PollUntilContextTimeout(ctx, pollInterval, volumeTimeout, true, func(context.Context) (bool, error) {
		pv, deleted = e.pvs.get(claim)
		return deleted || pv.Annotations[v1alpha1.AnnotationResult] != "", nil
	})
	if err != nil {
		e.t.Fatalf("the volume %s of claim %s/%s did not end within %s: %v (phase %s, annotations %v)",
			pv.Name, e.Namespace, claim, volumeTimeout, err, pv.Status.Phase, pv.Annotations)
	}
	isEnd := func(ev *corev1.Event) bool { _, ok := endReasons[ev.Reason]; return ok }
	ev := e.waitEventOn(ctx, isEnd,
		eventSubject{e.Namespace, "PersistentVolumeClaim", claim},
		eventSubject{metav1.NamespaceDefault, "PersistentVolume", pv.Name})
	end := volumeEnd{PV: pv, Reason: ev.Reason, Event: ev.Message}
	if end.Reason != want {
		e.t.Errorf("volume %s of claim %s: %s (%q), want %s; PV annotations %v", pv.Name, claim, end.Reason, end.Event, want, pv.Annotations)
	}
	if got := pv.Annotations[v1alpha1.AnnotationResult]; !deleted && got != endReasons[want] {
		e.t.Errorf("volume %s of claim %s: PV records result %q, want %q", pv.Name, claim, got, endReasons[want])
	}
	return end
}

// eventSubject names an object Events are about; PVs' Events are in the
// default namespace.
type eventSubject struct{ namespace, kind, name string }

// waitEvent waits for an Event about the named object in namespace that
// match accepts, and returns it.
func (e *env) waitEvent(ctx context.Context, namespace, kind, name string, match func(*corev1.Event) bool) *corev1.Event {
	e.t.Helper()
	return e.waitEventOn(ctx, match, eventSubject{namespace, kind, name})
}

// waitEventOn waits for an Event about any of subjects that match accepts.
func (e *env) waitEventOn(ctx context.Context, match func(*corev1.Event) bool, subjects ...eventSubject) *corev1.Event {
	e.t.Helper()
	return e.waitEventWithin(ctx, eventTimeout, match, subjects...)
}

// waitEventWithin is waitEventOn for an Event that may take longer than
// eventTimeout to come.
func (e *env) waitEventWithin(ctx context.Context, timeout time.Duration, match func(*corev1.Event) bool, subjects ...eventSubject) *corev1.Event {
	e.t.Helper()
	var found *corev1.Event
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		seen = seen[:0]
		for _, sub := range subjects {
			selector := fields.Set{"involvedObject.kind": sub.kind, "involvedObject.name": sub.name}.AsSelector().String()
			list, err := e.Client.CoreV1().Events(sub.namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
			if err != nil {
				return false, err
			}
			for i := range list.Items {
				ev := &list.Items[i]
				seen = append(seen, sub.kind+" "+ev.Type+" "+ev.Reason+": "+ev.Message)
				if match(ev) {
					found = ev
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("no matching Event about %v within %s: %v; Events seen: %q", subjects, timeout, err, seen)
	}
	return found
}

// cache returns the Cache called name in the env's namespace.
func (e *env) cache(ctx context.Context, name string) (*v1alpha1.Cache, error) {
	var c v1alpha1.Cache
	if err := e.Caches.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: name}, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// nodeEntry returns the status of the scenario node's CacheReplica of c,
// or nil.
func (e *env) nodeEntry(c *v1alpha1.Cache) *v1alpha1.CacheReplicaStatus {
	var r v1alpha1.CacheReplica
	key := client.ObjectKey{Namespace: c.Namespace, Name: v1alpha1.CacheReplicaName(c.Name, e.Node.Name)}
	if err := e.Caches.Get(e.t.Context(), key, &r); err != nil {
		return nil
	}
	return &r.Status
}

// waitGeneration waits until Cache name reports generation gen both in the
// node's replica (node agent) and in status.generation (manager).
func (e *env) waitGeneration(ctx context.Context, name string, gen int64) *v1alpha1.Cache {
	e.t.Helper()
	var last *v1alpha1.Cache
	err := wait.PollUntilContextTimeout(ctx, pollInterval, statusTimeout, true, func(ctx context.Context) (bool, error) {
		c, err := e.cache(ctx, name)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		last = c
		n := e.nodeEntry(c)
		return n != nil && n.Generation == gen && c.Status.Generation == gen, nil
	})
	if err != nil {
		e.t.Fatalf("Cache %s/%s did not reach generation %d on node %s within %s: %v; last status: %s",
			e.Namespace, name, gen, e.Node.Name, statusTimeout, err, statusString(last))
	}
	return last
}

func statusString(c *v1alpha1.Cache) string {
	if c == nil {
		return "no Cache"
	}
	b, err := json.Marshal(c.Status)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// waitClaimRefused waits for the Warning Event with reason that the node
// agent records on the claim of pod, checks that its message contains each
// of want, and that the claim got no PV.
func (e *env) waitClaimRefused(ctx context.Context, pod, reason string, want ...string) *corev1.Event {
	e.t.Helper()
	ev := e.waitEvent(ctx, e.Namespace, "PersistentVolumeClaim", claimName(pod), func(ev *corev1.Event) bool {
		// The agent records events.k8s.io Events: the core view has the
		// reporter in reportingComponent, not in source.
		return ev.Reason == reason && ev.ReportingController == "layercache-node"
	})
	if ev.Type != corev1.EventTypeWarning {
		e.t.Errorf("Event %s on claim %s is of type %s, want %s", reason, claimName(pod), ev.Type, corev1.EventTypeWarning)
	}
	for _, w := range want {
		if !strings.Contains(ev.Message, w) {
			e.t.Errorf("Event %s on claim %s says %q; want it to mention %q", reason, claimName(pod), ev.Message, w)
		}
	}
	e.expectNoVolume(ctx, pod)
	return ev
}

// expectNoVolume checks that the claim of pod is unbound and has no PV.
func (e *env) expectNoVolume(ctx context.Context, pod string) {
	e.t.Helper()
	pvc, err := e.Client.CoreV1().PersistentVolumeClaims(e.Namespace).Get(ctx, claimName(pod), metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending || pvc.Spec.VolumeName != "" {
		e.t.Errorf("claim %s is %s with volume %q, want Pending without a volume", pvc.Name, pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	if pv, _ := e.pvs.get(pvc.Name); pv != nil {
		e.t.Errorf("claim %s got PV %s, want none", pvc.Name, pv.Name)
	}
}

// nodeCaches lists the caches of the env's namespace in the node's store.
func (e *env) nodeCaches(ctx context.Context) []string {
	e.t.Helper()
	dir := "/var/lib/layercache/caches/" + e.Namespace
	out, err := e.Cluster.NodeExec(ctx, e.Node, "sh", "-c", `[ ! -d "$1" ] || ls -1A "$1"`, "sh", dir)
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.Fields(out)
}

// agentPods lists the node agent's pods on the scenario's node.
func (e *env) agentPods(ctx context.Context) ([]corev1.Pod, error) {
	pods, err := e.Client.CoreV1().Pods(framework.SystemNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=layercache,app.kubernetes.io/component=node",
		FieldSelector: "spec.nodeName=" + e.Node.Name,
	})
	if err != nil {
		return nil, fmt.Errorf("listing the node agent's pods on %s: %w", e.Node.Name, err)
	}
	return pods.Items, nil
}

// agentPod returns the node agent's pod on the scenario's node.
func (e *env) agentPod(ctx context.Context) *corev1.Pod {
	e.t.Helper()
	pods, err := e.agentPods(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var live []corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	if len(live) != 1 {
		e.t.Fatalf("%d node agent pods on node %s, want 1", len(live), e.Node.Name)
	}
	return &live[0]
}

// waitAgentReady waits until a node agent pod other than the one with UID
// old runs Ready on the scenario's node, and returns it.
func (e *env) waitAgentReady(ctx context.Context, old string, timeout time.Duration) *corev1.Pod {
	e.t.Helper()
	var ready *corev1.Pod
	var last string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := e.agentPods(ctx)
		if err != nil {
			return false, err
		}
		for i := range pods {
			p := &pods[i]
			if string(p.UID) == old || p.DeletionTimestamp != nil {
				continue
			}
			last = fmt.Sprintf("%s %s ready=%v", p.Name, p.Status.Phase, podReady(p))
			if podReady(p) {
				ready = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("no new Ready node agent on %s within %s: %v (last: %s)", e.Node.Name, timeout, err, last)
	}
	return ready
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, cs := range p.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n
}

// lines splits output into its non-empty lines.
func lines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// clientFor is a client of the Cache resources with cfg (an impersonating
// config of framework.AsLayercache or AsUser).
func (e *env) clientFor(cfg *rest.Config) client.Client {
	e.t.Helper()
	cl, err := client.New(cfg, client.Options{Scheme: e.Caches.Scheme()})
	if err != nil {
		e.t.Fatal(err)
	}
	return cl
}
