//go:build e2e && benchpeer

package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
	"github.com/layercache/layercache/nodeagent/kit"
)

// csiMinDuration is about what TestBenchCSI takes with 5 runs on the
// 2-core machine kind: 8 minutes before the registry variant, whose six
// trivial pods (and their publishes) add about one.
const csiMinDuration = 9 * time.Minute

// eventTimeout bounds the wait for the Committed Event on a CSI pod once
// its commit was seen.
const eventTimeout = 30 * time.Second

// TestBenchCSI measures layercache's CSI inline volumes (driver
// layercache.dev): a trivial pod's create → Succeeded with a CSI volume
// against the same pod with an emptyDir, the claim mode (a generic
// ephemeral claim of StorageClass layercache) beside it, and a CSI volume
// of the cluster's registry StorageClass on the node that has its cache
// (issue 36); the warm Go build
// pod end to end with a CSI cache against the same pod with a hostPath
// cache; layercache's API writes per completed CSI pod; and that no CSI
// pod makes a claim or a PV. Results: csi.txt and csi.json in
// BENCH_OUTPUT. It needs no peer, but builds with the benchpeer tag as
// TestBenchPeer does, so that `make e2e` does not run it; run.sh (`make
// bench-e2e`) runs both.
func TestBenchCSI(t *testing.T) {
	opts, err := OptionsFromEnv(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	if goBuildUID != framework.BuildUID {
		t.Fatalf("goBuildUID %d is not framework.BuildUID %d", goBuildUID, framework.BuildUID)
	}
	started := time.Now()
	ctx := t.Context()
	if deadline, ok := t.Deadline(); ok {
		if left := time.Until(deadline); left < csiMinDuration+cleanupMargin {
			t.Fatalf("go test -timeout leaves %s; TestBenchCSI needs about %s and %s for cleaning up: run it with make bench-e2e, or go test -timeout 30m",
				left.Round(time.Second), csiMinDuration, cleanupMargin)
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-cleanupMargin))
		defer cancel()
	}

	var b *bench
	t.Cleanup(func() {
		if b != nil {
			b.removeNodeRoot()
		}
	})
	removeLeftovers(t)
	f := framework.New(t)
	b = newBench(t, f, opts)
	sameFS, registryClass := b.csiPreflight(ctx)
	objects := b.trackVolumeObjects(ctx)

	goroot, downloads := framework.GoPaths(t)
	f.CreateHelloSource(ctx, goSourceConfig)
	hostDir := path.Join(NodeRoot, "csi-hostpath", f.Namespace)
	f.HostPathCacheDir(ctx, b.node, hostDir)

	pod := func(g string, v Variant, run int) *corev1.Pod {
		if g == GroupTrivial {
			// The warm-up pod finds an empty cache; every later one the
			// file of the one before.
			return TrivialPod(v, run, b.hostname, run >= 0 && v.layercache(), registryClass)
		}
		return GoBuildPod(v, run, b.hostname, goroot, downloads, hostDir)
	}
	var runs []CSIRun
	for _, g := range Groups {
		// One unmeasured pod per variant first: it makes the caches warm
		// (and the Go build's GOCACHE full), and loads what the first pod
		// of a kind loads on the node.
		for _, v := range GroupVariants[g] {
			r, err := b.csiRun(ctx, g, v, -1, pod(g, v, -1))
			if err != nil {
				t.Fatalf("%s, %s, warm-up: %v", g, v, err)
			}
			t.Logf("%s %s warm-up: %s", g, v, formatCSIRun(r))
			runs = append(runs, r)
		}
		for run := range opts.Runs {
			for _, v := range VariantOrder(GroupVariants[g], run) {
				r, err := b.csiRun(ctx, g, v, run, pod(g, v, run))
				if err != nil {
					t.Fatalf("%s, %s, run %d: %v", g, v, run, err)
				}
				t.Logf("%s %s run %d: %s", g, v, run, formatCSIRun(r))
				runs = append(runs, r)
			}
		}
	}

	rows, err := SummarizeCSI(runs)
	if err != nil {
		t.Fatal(err)
	}
	writes, notes := SummarizeCSIWrites(runs)
	report := CSIReport{
		Started: started, Finished: time.Now(), Backend: f.Cluster.Backend, Node: b.node.Name, Runs: opts.Runs,
		SameFilesystem: sameFS, Rows: rows, Writes: writes, Objects: objects.result(opts.Runs),
		Notes: notes, Definitions: CSIDefinitions, Samples: runs,
	}
	var text strings.Builder
	if err := report.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("results:\n%s", text.String())
	if err := report.WriteFiles(opts.Output); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote csi.json and csi.txt to %s", opts.Output)

	// The targets, loosely: only a clear miss fails (the cluster is shared
	// and its timings noisy); csi.txt says met or missed.
	for _, row := range rows {
		if row.Target > 0 && row.Ratio > FailRatio {
			t.Errorf("%s, %s: create → Succeeded is %.2fx the %s's (target ≤ %.1f, fails above %.1f)",
				row.Group, row.Variant, row.Ratio, GroupVariants[row.Group][0], row.Target, FailRatio)
		}
	}
	for _, g := range Groups {
		// The plain CSI volume's target; the registry class's pod has
		// none (see TargetWrites), csi.txt shows its count.
		i := slices.IndexFunc(writes, func(w CSIWrites) bool { return w.Group == g && w.Variant == VariantCSI })
		if i < 0 {
			t.Errorf("%s, CSI: layercache's API writes could not be counted (%s)", g, strings.Join(notes, "; "))
			continue
		}
		if w := writes[i]; w.NetPerPod > FailWrites {
			t.Errorf("%s, CSI: %.1f API writes per completed pod, net of the background (target ≤ %g, fails above %g)", g, w.NetPerPod, TargetWrites, FailWrites)
		}
	}
	if o := report.Objects; len(o.ForeignClaims)+len(o.ForeignVolumes) > 0 {
		t.Errorf("claims %v and PVs %v of namespace %s belong to no claim-mode pod: a CSI pod made them", o.ForeignClaims, o.ForeignVolumes, f.Namespace)
	}
}

// csiPreflight fails the test unless layercache, its CSIDriver, its
// StorageClass and the cluster's registry with its StorageClass are
// deployed and ready, reports whether layercache's store and the
// benchmark's hostPath directory share a filesystem, and returns the
// registry's StorageClass.
func (b *bench) csiPreflight(ctx context.Context) (sameFilesystem bool, registryClass string) {
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
	const fix = "make bench-e2e starts the cluster with layercache (make up)"
	drv, err := client.StorageV1().CSIDrivers().Get(ctx, v1alpha1.CSIDriverName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("CSIDriver %s: %v; %s", v1alpha1.CSIDriverName, err, fix)
	}
	if drv.Spec.PodInfoOnMount == nil || !*drv.Spec.PodInfoOnMount {
		t.Fatalf("CSIDriver %s lacks podInfoOnMount; redeploy layercache", v1alpha1.CSIDriverName)
	}
	sc, err := client.StorageV1().StorageClasses().Get(ctx, v1alpha1.StorageClassName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("StorageClass %s: %v; %s", v1alpha1.StorageClassName, err, fix)
	}
	if sc.Provisioner != v1alpha1.ProvisionerName {
		t.Fatalf("StorageClass %s has provisioner %s, want %s; %s", sc.Name, sc.Provisioner, v1alpha1.ProvisionerName, fix)
	}
	// The registry variant needs the registry and its class; run.sh
	// checks them too, before the peer's build.
	const registryFix = "make bench-e2e starts the cluster with the registry (make up WITH=registry, local backend only)"
	reg := b.f.Cluster.Registry
	if reg == nil || reg.StorageClass == "" {
		t.Fatalf("the cluster has no registry in cluster.json; %s", registryFix)
	}
	rsc, err := client.StorageV1().StorageClasses().Get(ctx, reg.StorageClass, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the registry's StorageClass %s: %v; %s", reg.StorageClass, err, registryFix)
	}
	if rsc.Provisioner != v1alpha1.ProvisionerName || rsc.Parameters[kit.ParamRegistry] == "" {
		t.Fatalf("StorageClass %s has provisioner %s and parameters %v, want %s with a registry; %s",
			rsc.Name, rsc.Provisioner, rsc.Parameters, v1alpha1.ProvisionerName, registryFix)
	}
	ds, err := client.AppsV1().DaemonSets(framework.SystemNamespace).Get(ctx, "layercache-node", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("layercache's node agent: %v; %s", err, fix)
	}
	if ds.Status.DesiredNumberScheduled == 0 || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
		t.Fatalf("layercache's node agents are not ready (%d of %d); see kubectl -n %s get pods", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, framework.SystemNamespace)
	}
	dep, err := client.AppsV1().Deployments(framework.SystemNamespace).Get(ctx, "layercache-manager", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("layercache's manager: %v; %s", err, fix)
	}
	if !deploymentReady(dep) {
		t.Fatalf("layercache's manager is not ready (%d of %d replicas)", dep.Status.ReadyReplicas, replicas(dep))
	}
	out, err := b.f.Cluster.NodeExec(ctx, b.node, "sh", "-c", fmt.Sprintf("mkdir -p %s && stat -c %%d %s %s", NodeRoot, LayercacheRoot, NodeRoot))
	if err != nil {
		t.Fatalf("comparing the filesystems of %s and %s: %v", LayercacheRoot, NodeRoot, err)
	}
	devs := strings.Fields(out)
	sameFilesystem = len(devs) == 2 && devs[0] == devs[1]
	if !sameFilesystem {
		t.Logf("WARNING: %s and %s are on different filesystems (devices %v); the Go build comparison is not fair", LayercacheRoot, NodeRoot, devs)
	}
	return sameFilesystem, reg.StorageClass
}

// csiRun runs one pod: the time from the create call to the watch seeing
// it Succeeded; for layercache's variants the commit of its volume seen
// in the Cache's status (and, for a CSI volume, the Committed Event on the
// pod, and no claim or PV in the namespace); then it deletes the pod and
// waits until it and its volume are gone. Layercache's API writes are
// counted from before the create call until then.
func (b *bench) csiRun(ctx context.Context, g string, v Variant, run int, pod *corev1.Pod) (CSIRun, error) {
	r := CSIRun{Group: g, Variant: v, Run: run, Pod: pod.Name}
	var commit <-chan commitResult
	if name := csiCache(g, v); name != "" {
		gen, err := b.generation(ctx, name)
		if err != nil {
			return r, err
		}
		commit = b.watchCommit(ctx, name, gen, RunTimeout+CommitTimeout)
	}
	before, beforeErrs := b.scrapeRequests(ctx)
	r.Submitted = time.Now()
	if _, err := b.f.CreatePod(ctx, pod); err != nil {
		return r, err
	}
	succeeded, err := b.waitEnded(ctx, pod.Name, RunTimeout)
	if err != nil {
		return r, err
	}
	r.Succeeded = succeeded
	r.Seconds = succeeded.Sub(r.Submitted).Seconds()
	if commit != nil {
		res := awaitCommit(commit)
		if res.err != nil {
			return r, fmt.Errorf("commit of cache %s: %w", csiCache(g, v), res.err)
		}
		r.CommitSeconds = res.at.Sub(succeeded).Seconds()
	}
	if v.csi() {
		if err := b.noVolumeObjects(ctx); err != nil {
			return r, fmt.Errorf("pod %s with a CSI volume: %w", pod.Name, err)
		}
		if err := b.waitPodEvent(ctx, pod.Name, "Committed"); err != nil {
			return r, err
		}
	}
	logs, err := b.f.PodLogs(ctx, pod.Name, ContainerName)
	if err != nil {
		return r, err
	}
	if r.Markers, err = ParseMarkers(logs); err != nil {
		return r, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	need := []string{MarkStart, MarkBuilt}
	if g == GroupGoBuild {
		need = append(need, MarkReady)
	}
	if err := r.Markers.Require(need...); err != nil {
		return r, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	r.StartSeconds = r.Markers[MarkStart].Sub(r.Submitted).Seconds()
	r.EndSeconds = succeeded.Sub(r.Markers[MarkBuilt]).Seconds()
	if g == GroupGoBuild {
		if r.GoCacheEntries, err = ParseGoCacheEntries(logs); err != nil {
			return r, fmt.Errorf("pod %s: %w", pod.Name, err)
		}
		if run >= 0 && r.GoCacheEntries == 0 {
			return r, fmt.Errorf("pod %s found GOCACHE empty: the warm-up build's cache did not reach it", pod.Name)
		}
		r.BuildSeconds = r.Markers[MarkBuilt].Sub(r.Markers[MarkReady]).Seconds()
	}
	if err := b.release(ctx, pod.Name); err != nil {
		return r, err
	}
	time.Sleep(writeSettle)
	after, afterErrs := b.scrapeRequests(ctx)
	maps.Copy(beforeErrs, afterErrs)
	w := NewWriteWindow(time.Since(r.Submitted).Seconds(), before, after, beforeErrs)
	r.Writes = &w
	return r, nil
}

// noVolumeObjects fails unless the test's namespace has no claim and no
// PV is bound to one of it: while a CSI pod runs the claim variant's are
// gone (release waits for them).
func (b *bench) noVolumeObjects(ctx context.Context) error {
	claims, err := b.f.Client.CoreV1().PersistentVolumeClaims(b.f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing claims: %w", err)
	}
	pvs, err := volumesOf(ctx, b.f.Client, func(ref *corev1.ObjectReference) bool { return ref.Namespace == b.f.Namespace })
	if err != nil {
		return fmt.Errorf("listing PVs: %w", err)
	}
	if len(claims.Items) > 0 || len(pvs) > 0 {
		var names []string
		for _, c := range claims.Items {
			names = append(names, c.Name)
		}
		return fmt.Errorf("namespace %s has claims %v and PVs %v", b.f.Namespace, names, pvs)
	}
	return nil
}

// waitPodEvent waits for an Event of reason about the pod.
func (b *bench) waitPodEvent(ctx context.Context, pod, reason string) error {
	sel := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod}.AsSelector().String()
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, eventTimeout, true, func(ctx context.Context) (bool, error) {
		list, err := b.f.Client.CoreV1().Events(b.f.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, ev := range list.Items {
			seen = append(seen, ev.Reason)
			if ev.Reason == reason {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("no %s Event on pod %s within %s after its commit was seen: %w (events: %v)", reason, pod, eventTimeout, err, seen)
	}
	return nil
}

// volumeObjects records every claim of the test's namespace and every PV
// bound to one that an informer sees, for the whole test.
type volumeObjects struct {
	mu     sync.Mutex
	claims map[string]bool
	pvs    map[string]string // PV name → claim name
}

func (b *bench) trackVolumeObjects(ctx context.Context) *volumeObjects {
	t, ns := b.t, b.f.Namespace
	o := &volumeObjects{claims: map[string]bool{}, pvs: map[string]string{}}
	unwrap := func(obj any) any {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			return d.Obj
		}
		return obj
	}
	recordClaim := func(obj any) {
		if c, ok := unwrap(obj).(*corev1.PersistentVolumeClaim); ok {
			o.mu.Lock()
			o.claims[c.Name] = true
			o.mu.Unlock()
		}
	}
	recordPV := func(obj any) {
		if pv, ok := unwrap(obj).(*corev1.PersistentVolume); ok && pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
			o.mu.Lock()
			o.pvs[pv.Name] = pv.Spec.ClaimRef.Name
			o.mu.Unlock()
		}
	}
	nsFactory := informers.NewSharedInformerFactoryWithOptions(b.f.Client, 0, informers.WithNamespace(ns))
	factory := informers.NewSharedInformerFactory(b.f.Client, 0)
	for _, h := range []struct {
		informer cache.SharedIndexInformer
		record   func(any)
	}{
		{nsFactory.Core().V1().PersistentVolumeClaims().Informer(), recordClaim},
		{factory.Core().V1().PersistentVolumes().Informer(), recordPV},
	} {
		if _, err := h.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: h.record, UpdateFunc: func(_, obj any) { h.record(obj) }, DeleteFunc: h.record,
		}); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	nsFactory.Start(stop)
	factory.Start(stop)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, f := range []informers.SharedInformerFactory{nsFactory, factory} {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				t.Fatalf("syncing the %v informer failed", typ)
			}
		}
	}
	return o
}

// result sorts what was seen into the claim variant's claims and PVs and
// the others.
func (o *volumeObjects) result(runs int) CSIObjects {
	allowed := map[string]bool{}
	for run := -1; run < runs; run++ {
		allowed[ClaimName(RunPodName(GroupTrivial, VariantClaim, run))] = true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	res := CSIObjects{Claims: []string{}, Volumes: []string{}}
	for _, c := range slices.Sorted(maps.Keys(o.claims)) {
		if allowed[c] {
			res.Claims = append(res.Claims, c)
		} else {
			res.ForeignClaims = append(res.ForeignClaims, c)
		}
	}
	for _, pv := range slices.Sorted(maps.Keys(o.pvs)) {
		if allowed[o.pvs[pv]] {
			res.Volumes = append(res.Volumes, pv)
		} else {
			res.ForeignVolumes = append(res.ForeignVolumes, pv)
		}
	}
	return res
}

func formatCSIRun(r CSIRun) string {
	parts := []string{fmt.Sprintf("create → Succeeded %s (container runs after %s, Succeeded seen %s after the script's end)",
		seconds(r.Seconds), seconds(r.StartSeconds), seconds(r.EndSeconds))}
	if r.Variant.layercache() {
		parts = append(parts, fmt.Sprintf("commit seen %s later", seconds(r.CommitSeconds)))
	}
	if r.Group == GroupGoBuild {
		parts = append(parts, fmt.Sprintf("go build %s, GOCACHE had %d entries", seconds(r.BuildSeconds), r.GoCacheEntries))
	}
	if w := r.Writes; w != nil {
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
