//go:build e2e && benchpeer

package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	runtimeapi "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

var replicaGVR = v1alpha1.GroupVersion.WithResource("cachereplicas")

const pollInterval = 200 * time.Millisecond

// cleanupMargin is what the cleanups may take after the measurements: the
// framework's namespace removal and the wait for the volumes.
const cleanupMargin = framework.NamespaceTimeout + 2*CleanupTimeout

// minDuration is about what the default benchmark takes on the CI machine
// kind (2 cores).
const minDuration = 20 * time.Minute

// TestBenchPeer measures layercache against rancher/local-path-provisioner
// (see the package documentation). It needs the peer that run.sh deploys,
// so it builds only with the benchpeer tag that run.sh (`make bench-e2e`)
// sets; `make e2e` does not compile it.
func TestBenchPeer(t *testing.T) {
	opts, err := OptionsFromEnv(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := opts.Cases()
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()

	// End the measurements early enough for the cleanup to finish before
	// go test's -timeout kills the binary, which would leave everything.
	ctx := t.Context()
	if deadline, ok := t.Deadline(); ok {
		if left := time.Until(deadline); left < minDuration+cleanupMargin {
			t.Fatalf("go test -timeout leaves %s; the benchmark needs about %s and %s for cleaning up: run it with make bench-e2e, or go test -timeout 60m",
				left.Round(time.Second), minDuration, cleanupMargin)
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-cleanupMargin))
		defer cancel()
	}

	// Registered before framework.New, so it runs after the framework has
	// dumped a failed test's namespace and deleted it: then the volumes'
	// directories can go.
	var b *bench
	t.Cleanup(func() {
		if b != nil {
			b.removeNodeRoot()
		}
	})
	removeLeftovers(t)
	f := framework.New(t)
	b = newBench(t, f, opts)

	report := Report{
		Started: started, Backend: f.Cluster.Backend, Node: b.node.Name, Runs: opts.Runs,
		Peer: Peer, Cases: cases, Definitions: MetricDefinitions,
		SeedSeconds: map[string]map[System]float64{},
	}
	report.SameFilesystem = b.preflight(ctx)

	var samples []Sample
	for _, c := range cases {
		seeds, err := b.seed(ctx, c)
		if err != nil {
			t.Fatalf("seeding case %s: %v", c.Name, err)
		}
		report.SeedSeconds[c.Name] = seeds
		for run := range opts.Runs {
			// Alternate the systems, and which goes first, so that drift on
			// the machine and the aftermath of one run hit both alike.
			order := slices.Clone(Systems)
			if run%2 == 1 {
				slices.Reverse(order)
			}
			for _, s := range order {
				sample, err := b.run(ctx, s, c, run)
				if err != nil {
					t.Fatalf("%s, case %s, run %d: %v", s, c.Name, run, err)
				}
				t.Logf("%s %s run %d: %s", s, c.Name, run, formatSample(sample))
				samples = append(samples, sample)
			}
		}
		if err := b.removeStore(ctx, c); err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
	}

	rows, err := Summarize(cases, samples)
	if err != nil {
		t.Fatal(err)
	}
	report.Finished, report.Rows, report.Samples = time.Now(), rows, samples
	report.CommitSpans = SummarizeCommitSpans(cases, samples)
	report.WriteRows, report.WriteNotes = SummarizeWrites(cases, samples)
	report.WriteNotes = append(report.WriteNotes, FailedWriteNotes(cases, samples)...)
	var text strings.Builder
	if err := report.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("results:\n%s", text.String())
	if err := report.WriteFiles(opts.Output); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote results.json and results.txt to %s", opts.Output)
}

// bench runs the workload of one test on one node.
type bench struct {
	t    *testing.T
	f    *framework.Framework
	dyn  dynamic.Interface
	node framework.Node
	// hostname is the node's kubernetes.io/hostname label, which the pods
	// select.
	hostname string
}

func newBench(t *testing.T, f *framework.Framework, opts Options) *bench {
	t.Helper()
	dyn, err := dynamic.NewForConfig(f.Config)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	node := f.Cluster.Nodes[0]
	if opts.Node != "" {
		if node, err = f.Cluster.Node(opts.Node); err != nil {
			t.Fatalf("BENCH_NODE: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"true"}}}`, BenchLabel)
	if _, err := f.Client.CoreV1().Namespaces().Patch(ctx, f.Namespace, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("labelling namespace %s: %v", f.Namespace, err)
	}
	return &bench{t: t, f: f, dyn: dyn, node: node}
}

// preflight fails the test unless both systems are deployed and ready, and
// reports whether layercache's store and the peer's volumes share a
// filesystem.
func (b *bench) preflight(ctx context.Context) (sameFilesystem bool) {
	t, client := b.t, b.f.Client
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	node, err := client.CoreV1().Nodes().Get(ctx, b.node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node %s: %v", b.node.Name, err)
	}
	b.hostname = node.Labels[corev1.LabelHostname]
	if b.hostname == "" {
		t.Fatalf("node %s has no %s label; the pods select their node by it", node.Name, corev1.LabelHostname)
	}

	const fix = "make bench-e2e starts the cluster with layercache (make up) and deploys the peer (e2e/bench/run.sh)"
	for class, provisioner := range map[string]string{v1alpha1.StorageClassName: v1alpha1.ProvisionerName, PeerStorageClass: PeerProvisioner} {
		sc, err := client.StorageV1().StorageClasses().Get(ctx, class, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("StorageClass %s: %v; %s", class, err, fix)
		}
		if sc.Provisioner != provisioner {
			t.Fatalf("StorageClass %s has provisioner %s, want %s; %s", class, sc.Provisioner, provisioner, fix)
		}
	}
	ds, err := client.AppsV1().DaemonSets(framework.SystemNamespace).Get(ctx, "layercache-node", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("layercache's node agent: %v; %s", err, fix)
	}
	if ds.Status.DesiredNumberScheduled == 0 || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
		t.Fatalf("layercache's node agents are not ready (%d of %d); see kubectl -n %s get pods", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, framework.SystemNamespace)
	}
	for _, d := range []struct{ ns, name string }{{framework.SystemNamespace, "layercache-manager"}, {PeerNamespace, PeerDeployment}} {
		dep, err := client.AppsV1().Deployments(d.ns).Get(ctx, d.name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Deployment %s/%s: %v; %s", d.ns, d.name, err, fix)
		}
		if !deploymentReady(dep) {
			t.Fatalf("Deployment %s/%s is not ready (%d of %d replicas); see kubectl -n %s get pods", d.ns, d.name, dep.Status.ReadyReplicas, replicas(dep), d.ns)
		}
	}

	out, err := b.f.Cluster.NodeExec(ctx, b.node, "sh", "-c", fmt.Sprintf("mkdir -p %s && stat -c %%d %s %s", PeerNodePath, LayercacheRoot, PeerNodePath))
	if err != nil {
		t.Fatalf("comparing the filesystems of %s and %s: %v", LayercacheRoot, PeerNodePath, err)
	}
	devs := strings.Fields(out)
	sameFilesystem = len(devs) == 2 && devs[0] == devs[1]
	if !sameFilesystem {
		t.Logf("WARNING: %s and %s are on different filesystems (devices %v); the comparison is not fair", LayercacheRoot, PeerNodePath, devs)
	}
	return sameFilesystem
}

func deploymentReady(d *appsv1.Deployment) bool {
	return d.Status.ReadyReplicas >= replicas(d) && d.Status.UpdatedReplicas >= replicas(d)
}

func replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// seed fills both systems' caches of the case and returns how long each
// took, from submitting the seed pod to the seed being committed.
func (b *bench) seed(ctx context.Context, c Case) (map[System]float64, error) {
	took := map[System]float64{}
	if c.Shared() {
		pod := SeedPod(Layercache, c, b.hostname)
		commit := b.watchCommit(ctx, c.CacheName(0), 0, SeedTimeout+CommitTimeout)
		start := time.Now()
		if err := b.runToEnd(ctx, pod, SeedTimeout, SeedFiles(c.Seed)); err != nil {
			return nil, err
		}
		res := awaitCommit(commit)
		if res.err != nil {
			return nil, fmt.Errorf("layercache seed of cache %s: %w", c.CacheName(0), res.err)
		}
		took[Layercache] = res.at.Sub(start).Seconds()
		if err := b.release(ctx, pod.Name); err != nil {
			return nil, err
		}
	}

	if _, err := b.f.Client.CoreV1().PersistentVolumeClaims(b.f.Namespace).Create(ctx, StoreClaim(c), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the local-path store claim: %w", err)
	}
	pod := SeedPod(LocalPath, c, b.hostname)
	start := time.Now()
	if err := b.runToEnd(ctx, pod, SeedTimeout, SeedFiles(c.Seed)); err != nil {
		return nil, err
	}
	took[LocalPath] = time.Since(start).Seconds()
	if err := b.release(ctx, pod.Name); err != nil {
		return nil, err
	}
	b.t.Logf("case %s seeded (%s): %s", c.Name, c.Title, formatSystems(took))
	return took, nil
}

// runToEnd runs a seed pod until it succeeds and checks the files it wrote.
func (b *bench) runToEnd(ctx context.Context, pod *corev1.Pod, timeout time.Duration, wantFiles int) error {
	if _, err := b.f.CreatePod(ctx, pod); err != nil {
		return err
	}
	if err := b.waitSucceeded(ctx, pod.Name, timeout); err != nil {
		return err
	}
	logs, err := b.f.PodLogs(ctx, pod.Name, ContainerName)
	if err != nil {
		return err
	}
	n, err := ParseSeedFiles(logs)
	if err != nil {
		return fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	if n != wantFiles {
		return fmt.Errorf("pod %s wrote %d files, want %d; is the node's disk full?", pod.Name, n, wantFiles)
	}
	return nil
}

// run measures one build pod and the next pod that names its cache,
// submitted as soon as the build pod has ended. Layercache's API writes
// are counted from before the build pod is submitted until both pods and
// their volumes are gone.
func (b *bench) run(ctx context.Context, s System, c Case, run int) (Sample, error) {
	pod, next := RunPod(s, c, run, b.hostname), NextPod(s, c, run, b.hostname)
	var commit <-chan commitResult
	if s == Layercache {
		gen, err := b.generation(ctx, c.CacheName(run))
		if err != nil {
			return Sample{}, err
		}
		// Watching before the pod exists: the commit cannot be missed.
		commit = b.watchCommit(ctx, c.CacheName(run), gen, RunTimeout+CommitTimeout)
	}
	before, beforeErrs := b.scrapeRequests(ctx)
	obs := Observed{Submitted: time.Now()}
	if _, err := b.f.CreatePod(ctx, pod); err != nil {
		return Sample{}, err
	}
	ended, err := b.waitEnded(ctx, pod.Name, RunTimeout)
	if err != nil {
		return Sample{}, err
	}
	obs.PodEnded = ended
	if _, err := b.f.CreatePod(ctx, next); err != nil {
		return Sample{}, err
	}
	if commit != nil {
		res := awaitCommit(commit)
		if res.err != nil {
			return Sample{}, fmt.Errorf("layercache commit of cache %s: %w", c.CacheName(run), res.err)
		}
		obs.CommitObserved = res.at
	}
	if _, err := b.waitEnded(ctx, next.Name, RunTimeout); err != nil {
		return Sample{}, err
	}
	for _, p := range []struct {
		name string
		into *Markers
	}{{pod.Name, &obs.Markers}, {next.Name, &obs.NextMarkers}} {
		logs, err := b.f.PodLogs(ctx, p.name, ContainerName)
		if err != nil {
			return Sample{}, err
		}
		if *p.into, err = ParseMarkers(logs); err != nil {
			return Sample{}, fmt.Errorf("pod %s: %w", p.name, err)
		}
	}
	sample, err := NewSample(s, c, run, obs)
	if err != nil {
		return sample, err
	}
	if err := b.release(ctx, pod.Name, next.Name); err != nil {
		return sample, err
	}
	// What the agent reports after a volume is deleted lands within the
	// window too.
	time.Sleep(writeSettle)
	after, afterErrs := b.scrapeRequests(ctx)
	maps.Copy(beforeErrs, afterErrs)
	w := NewWriteWindow(time.Since(obs.Submitted).Seconds(), before, after, beforeErrs)
	sample.Writes = &w
	return sample, nil
}

// writeSettle is how long a run waits after its volumes are gone before it
// reads the write counters again.
const writeSettle = time.Second

// scrapeRequests reads the request counters of the node agent of the
// benchmark's node and of every manager replica (summed), through the API
// server's pod proxy. It returns why a component could not be read.
func (b *bench) scrapeRequests(ctx context.Context) (map[string]Requests, map[string]string) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got, errs := map[string]Requests{}, map[string]string{}
	for _, comp := range Components {
		label := map[string]string{ComponentNode: framework.ComponentNode, ComponentManager: framework.ComponentManager}[comp]
		node := ""
		if comp == ComponentNode {
			node = b.node.Name
		}
		pages, err := b.f.ComponentMetrics(ctx, label, node)
		if err != nil {
			errs[comp] = err.Error()
			continue
		}
		sum := Requests{}
		for pod, page := range pages {
			r, err := ParseRequests(page)
			if err != nil {
				errs[comp] = fmt.Sprintf("pod %s: %v", pod, err)
				break
			}
			for k, v := range r {
				sum[k] += v
			}
		}
		if errs[comp] == "" {
			got[comp] = sum
		}
	}
	return got, errs
}

// waitEnded watches the pod until it has succeeded with no container
// running, the state in which layercache's node agent ends its volumes,
// and returns when the test saw that. A failed pod is an error at once.
func (b *bench) waitEnded(ctx context.Context, name string, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pods := b.f.Client.CoreV1().Pods(b.f.Namespace)
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtimeapi.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	var at time.Time
	var last *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type == watch.Deleted {
			return false, nil
		}
		last = p
		switch {
		case p.Status.Phase == corev1.PodFailed:
			return false, errors.New("the pod failed; its log and the namespace's events are in the test log")
		case p.Status.Phase == corev1.PodSucceeded && noneRunning(p):
			at = time.Now()
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("pod %s/%s did not succeed within %s: %w (last seen: %s)", b.f.Namespace, name, timeout, err, podState(last))
	}
	return at, nil
}

// noneRunning reports whether no container of the pod runs.
func noneRunning(p *corev1.Pod) bool {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, s := range list {
			if s.State.Running != nil {
				return false
			}
		}
	}
	return true
}

// waitSucceeded waits until the pod has succeeded; a failed pod is an
// error at once.
func (b *bench) waitSucceeded(ctx context.Context, name string, timeout time.Duration) error {
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := b.f.Client.CoreV1().Pods(b.f.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		last = p
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			return true, nil
		case corev1.PodFailed:
			return false, errors.New("the pod failed; its log and the namespace's events are in the test log")
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("pod %s/%s did not succeed within %s: %w (last seen: %s)", b.f.Namespace, name, timeout, err, podState(last))
	}
	return nil
}

func podState(p *corev1.Pod) string {
	if p == nil {
		return "not found"
	}
	parts := []string{"phase " + string(p.Status.Phase)}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			parts = append(parts, fmt.Sprintf("%s: %s", c.Type, c.Message))
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			parts = append(parts, fmt.Sprintf("container %s waiting: %s %s", cs.Name, w.Reason, w.Message))
		}
		if term := cs.State.Terminated; term != nil {
			parts = append(parts, fmt.Sprintf("container %s exited %d", cs.Name, term.ExitCode))
		}
	}
	return strings.Join(parts, "; ")
}

// release deletes pods that have ended and waits until they and their
// cache volumes are gone, then flushes the node's dirty pages, so that the
// next run starts on a quiet node. A pod's generic ephemeral claim, and so
// its PV, goes away only with the pod: layercache commits when the pod
// ends and leaves the claim to Kubernetes, so without deleting the pod
// the volume would stay. Its deletion then only cleans up (for local-path
// its helper pod removes the directory).
func (b *bench) release(ctx context.Context, names ...string) error {
	ctx, cancel := context.WithTimeout(ctx, CleanupTimeout)
	defer cancel()
	pods := b.f.Client.CoreV1().Pods(b.f.Namespace)
	for _, pod := range names {
		if err := pods.Delete(ctx, pod, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting pod %s: %w", pod, err)
		}
	}
	for _, pod := range names {
		err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
			_, err := pods.Get(ctx, pod, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		})
		if err != nil {
			return fmt.Errorf("pod %s was not removed within %s: %w", pod, CleanupTimeout, err)
		}
	}
	claims := make([]string, len(names))
	for i, pod := range names {
		claims[i] = ClaimName(pod)
	}
	return b.waitClaimGone(ctx, claims...)
}

// removeStore deletes the case's local-path store and waits until its
// volume is gone.
func (b *bench) removeStore(ctx context.Context, c Case) error {
	ctx, cancel := context.WithTimeout(ctx, CleanupTimeout)
	defer cancel()
	err := b.f.Client.CoreV1().PersistentVolumeClaims(b.f.Namespace).Delete(ctx, c.StoreClaim(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the store claim %s: %w", c.StoreClaim(), err)
	}
	return b.waitClaimGone(ctx, c.StoreClaim())
}

// waitClaimGone waits until the claims and every PV bound to them are
// gone, then flushes the node's dirty pages.
func (b *bench) waitClaimGone(ctx context.Context, claims ...string) error {
	client, ns := b.f.Client, b.f.Namespace
	for _, claim := range claims {
		err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
			_, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
			if err == nil || !apierrors.IsNotFound(err) {
				return false, err
			}
			pvs, err := volumesOf(ctx, client, func(ref *corev1.ObjectReference) bool {
				return ref.Namespace == ns && ref.Name == claim
			})
			return len(pvs) == 0, err
		})
		if err != nil {
			return fmt.Errorf("the volume of claim %s/%s was not removed within %s: %w; see kubectl get pv, and the logs of the node agent or of the peer (kubectl -n %s logs deploy/%s)",
				ns, claim, CleanupTimeout, err, PeerNamespace, PeerDeployment)
		}
	}
	if _, err := b.f.Cluster.NodeExec(ctx, b.node, "sync"); err != nil {
		return fmt.Errorf("flushing the node's dirty pages: %w", err)
	}
	return nil
}

// volumesOf lists the names of the PVs whose claim reference matches.
func volumesOf(ctx context.Context, client kubernetes.Interface, match func(*corev1.ObjectReference) bool) ([]string, error) {
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, pv := range pvs.Items {
		if ref := pv.Spec.ClaimRef; ref != nil && match(ref) {
			names = append(names, pv.Name)
		}
	}
	return names, nil
}

// commitResult is when the test saw a cache's new generation.
type commitResult struct {
	at         time.Time
	generation int64
	err        error
}

// watchCommit watches the node's CacheReplica of the cache until it passes
// generation after, and sends when that was seen. A watch delivers the
// change within milliseconds, where polling would add its interval.
func (b *bench) watchCommit(ctx context.Context, name string, after int64, timeout time.Duration) <-chan commitResult {
	ch := make(chan commitResult, 1)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	caches := b.dyn.Resource(replicaGVR).Namespace(b.f.Namespace)
	selector := fields.OneTermEqualSelector("metadata.name", v1alpha1.CacheReplicaName(name, b.node.Name)).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtimeapi.Object, error) {
			o.FieldSelector = selector
			return caches.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return caches.Watch(ctx, o)
		},
	}
	go func() {
		defer cancel()
		var res commitResult
		_, err := watchtools.UntilWithSync(ctx, lw, &unstructured.Unstructured{}, nil, func(ev watch.Event) (bool, error) {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Deleted {
				return false, nil
			}
			gen, err := replicaGeneration(u)
			if err != nil || gen <= after {
				return false, err
			}
			res.at, res.generation = time.Now(), gen
			return true, nil
		})
		if err != nil {
			res.err = fmt.Errorf("Cache %s/%s did not pass generation %d on node %s within %s: %w; see kubectl -n %s get caches, and the node agent's log",
				b.f.Namespace, name, after, b.node.Name, timeout, err, b.f.Namespace)
		}
		ch <- res
	}()
	return ch
}

// awaitCommit waits at most CommitTimeout for a commit once its pod has
// ended.
func awaitCommit(commit <-chan commitResult) commitResult {
	timer := time.NewTimer(CommitTimeout)
	defer timer.Stop()
	select {
	case res := <-commit:
		return res
	case <-timer.C:
		return commitResult{err: fmt.Errorf("no new generation within %s after the pod ended; see kubectl get caches,pv, and the logs of layercache's manager and node agent", CommitTimeout)}
	}
}

// generation is the cache's generation on the node now; 0 for a cache that
// does not exist yet.
func (b *bench) generation(ctx context.Context, name string) (int64, error) {
	u, err := b.dyn.Resource(replicaGVR).Namespace(b.f.Namespace).Get(ctx, v1alpha1.CacheReplicaName(name, b.node.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the CacheReplica of %s/%s on %s: %w", b.f.Namespace, name, b.node.Name, err)
	}
	return replicaGeneration(u)
}

func replicaGeneration(u *unstructured.Unstructured) (int64, error) {
	var r v1alpha1.CacheReplica
	if err := runtimeapi.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
		return 0, fmt.Errorf("decoding CacheReplica %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return r.Status.Generation, nil
}

// removeLeftovers deletes what an interrupted run left: its namespaces and,
// once their volumes are gone, the benchmark's directory on every node.
func removeLeftovers(t *testing.T) {
	cfg, err := framework.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client for %s: %v", cfg.Host, err)
	}
	cluster, err := framework.LoadCluster()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*CleanupTimeout)
	defer cancel()
	nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: BenchLabel + "=true"})
	if err != nil {
		t.Fatalf("listing namespaces left by an earlier run: %v", err)
	}
	left := map[string]bool{}
	for _, ns := range nss.Items {
		t.Logf("removing namespace %s, left by an earlier run", ns.Name)
		if err := framework.DeleteNamespace(ctx, client, ns.Name); err != nil {
			t.Fatal(err)
		}
		left[ns.Name] = true
	}
	var pvs []string
	err = wait.PollUntilContextTimeout(ctx, pollInterval, CleanupTimeout, true, func(ctx context.Context) (bool, error) {
		var err error
		pvs, err = volumesOf(ctx, client, func(ref *corev1.ObjectReference) bool { return left[ref.Namespace] })
		return len(pvs) == 0, err
	})
	if err != nil {
		t.Fatalf("volumes %v of earlier runs were not removed within %s: %v; see kubectl get pv", pvs, CleanupTimeout, err)
	}
	if pvs, err = peerVolumes(ctx, client); err != nil || len(pvs) > 0 {
		t.Fatalf("the peer still has volumes %v (%v) in %s: delete their claims (kubectl get pv) before running the benchmark", pvs, err, PeerNodePath)
	}
	for _, n := range cluster.Nodes {
		if _, err := cluster.NodeExec(ctx, n, "rm", "-rf", "--one-file-system", NodeRoot); err != nil {
			t.Fatalf("removing %s left by an earlier run: %v", NodeRoot, err)
		}
	}
}

// peerVolumes lists the PVs of the peer's StorageClass.
func peerVolumes(ctx context.Context, client kubernetes.Interface) ([]string, error) {
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, pv := range pvs.Items {
		if pv.Spec.StorageClassName == PeerStorageClass {
			names = append(names, pv.Name)
		}
	}
	return names, nil
}

// removeNodeRoot removes the benchmark's directory from the node once the
// test's namespace and its volumes are gone.
func (b *bench) removeNodeRoot() {
	if os.Getenv("E2E_KEEP_NAMESPACES") != "" {
		b.t.Logf("keeping %s on node %s (E2E_KEEP_NAMESPACES is set)", NodeRoot, b.node.Name)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), CleanupTimeout)
	defer cancel()
	var pvs []string
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		var err error
		pvs, err = volumesOf(ctx, b.f.Client, func(ref *corev1.ObjectReference) bool { return ref.Namespace == b.f.Namespace })
		return len(pvs) == 0, err
	})
	if err != nil {
		b.t.Errorf("cleanup: volumes %v of namespace %s were not removed within %s (%v); %s stays on node %s", pvs, b.f.Namespace, CleanupTimeout, err, NodeRoot, b.node.Name)
		return
	}
	if _, err := b.f.Cluster.NodeExec(ctx, b.node, "rm", "-rf", "--one-file-system", NodeRoot); err != nil {
		b.t.Errorf("cleanup: %v", err)
	}
}

func formatSample(s Sample) string {
	var parts []string
	for _, k := range Metrics {
		if v, ok := s.Seconds[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %s", k, seconds(v)))
		}
	}
	if s.Stale {
		parts = append(parts, "next pod STALE")
	}
	if w := s.Writes; w != nil {
		for _, c := range Components {
			if u := w.Unavailable[c]; u != "" {
				parts = append(parts, fmt.Sprintf("%s writes unavailable: %s", c, u))
				continue
			}
			var ms []string
			for _, m := range WriteMethods {
				ms = append(ms, fmt.Sprintf("%s %g", m, w.Writes[c][m]))
			}
			parts = append(parts, fmt.Sprintf("%s writes in %.1fs: %s", c, w.Seconds, strings.Join(ms, " ")))
		}
	}
	return strings.Join(parts, ", ")
}

func formatSystems(m map[System]float64) string {
	var parts []string
	for _, s := range Systems {
		if v, ok := m[s]; ok {
			parts = append(parts, fmt.Sprintf("%s %s", s, seconds(v)))
		}
	}
	return strings.Join(parts, ", ")
}
