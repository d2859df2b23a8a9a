//go:build e2e

// Package soak puts one node under the load of many CI builds and checks
// that no cache loses or gains a file, that caches stay shallow, and that
// nothing is left behind; it reports start-up and commit latencies, the
// node agent's memory and CPU, API writes and Events per build, and the
// store's disk use. See TestLoad.
package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/bench"
	"github.com/layercache/layercache/e2e/framework"
)

const (
	volumeName = "cache"
	mountPath  = "/cache"
	// endTimeout bounds the wait for every volume's end once its pod
	// ended, and for claims, PVs and pods to go at the end, with no
	// fault (load.endTimeout).
	endTimeout = 2 * time.Minute
	// layerSlack is how far above the agent's --max-layers a cache may
	// be seen while few builds run: squash runs in the background after
	// the commit that crosses it, while builds keep committing.
	layerSlack = 4
	// maxRSS is the loose bound the test asserts; the target is in the
	// report.
	maxRSS = 1 << 30
)

// build is one build pod: what the test decided and what it measured.
type build struct {
	Index      int    `json:"index"`
	Name       string `json:"name"`
	Phase      int    `json:"phase"`
	Cache      string `json:"cache"`
	Volume     string `json:"volume"` // claim or csi
	ExpectFail bool   `json:"expectFail"`
	Kept       bool   `json:"kept"`
	// Interrupted: node-reboot killed the build's container before it
	// exited by itself; its pod ends Failed whatever the build decided,
	// so its volume must be discarded and its file never land.
	Interrupted bool `json:"interrupted,omitempty"`

	Created time.Time `json:"created"` // the test's clock before the create call
	Started time.Time `json:"started"` // the container's first instruction (/proc/uptime)
	Ended   time.Time `json:"ended"`   // its last instruction before exit
	SeenEnd time.Time `json:"seenEnd"` // the test's watch saw the pod terminal

	EndReason   string    `json:"endReason,omitempty"` // Committed or Discarded
	VolumeID    string    `json:"volumeID,omitempty"`
	VolumeEnded time.Time `json:"volumeEnded"` // the end Event's eventTime
	PV          string    `json:"pv,omitempty"`
}

func (b *build) wantReason() string {
	if b.ExpectFail || b.Interrupted {
		return "Discarded"
	}
	return "Committed"
}

type endNote struct {
	name  string
	phase corev1.PodPhase
	at    time.Time
	exit  string
}

// TestLoad runs SOAK_CONCURRENT build pods at once over SOAK_CACHES
// caches (phase 1), then keeps up to SOAK_CONCURRENT running until
// SOAK_BUILDS more have completed (phase 2). Each build, as uid 1000,
// writes a file of its own name into its cache and exits 0 or 1 as the
// test decided with a seeded RNG; half use a generic ephemeral claim,
// half a CSI inline volume (SOAK_VOLUME). Most pods are deleted as soon
// as they end, as CI systems do; every SOAK_KEEP_EVERY-th is kept.
//
// Hard checks: each pod ends as decided and its volume is committed or
// discarded as its outcome says, exactly once; each cache then holds
// exactly the files of its succeeded builds, at the generation that
// counts them; no cache is ever seen deeper than the agent's
// --max-layers plus layerSlack; at the end no pod, claim or PV of the
// test is left and none of its volumes is left in the node's store; the
// agent's RSS stays under 1 GiB. The figures are written to
// SOAK_OUTPUT/report.{md,json} beside the targets.
func TestLoad(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	runLoad(t, cfg)
}

// runLoad runs the load of cfg, under cfg.Fault, with every check, and
// writes its report.
func runLoad(t *testing.T, cfg config) {
	t.Logf("load: %d concurrent, %d churn builds, %d caches, %d%% failing, volumes %s, bound %s, fault %s, seed %d (SOAK_SEED=%d repeats the outcomes)",
		cfg.Concurrent, cfg.Builds, cfg.Caches, cfg.FailPercent, cfg.Volume, cfg.Duration, cfg.Fault, cfg.Seed, cfg.Seed)
	// Every pod of the load names its node (node 1; node 2 reads the
	// caches after the registry fault).
	f := framework.NewAcrossNodes(t)
	node := f.Cluster.Nodes[0]
	l := &load{t: t, f: f, cfg: cfg, node: node, pvByClaim: map[string]string{}, pvDeleted: map[string]bool{},
		phase2: make(chan struct{}), loadDone: make(chan struct{})}
	if cfg.Fault != faultNone {
		l.requireHost()
	}
	if cfg.Fault == faultRegistry {
		l.requireRegistry()
	}
	ctx, cancel := context.WithTimeout(t.Context(), cfg.Duration+4*l.endTimeout()+5*time.Minute+l.faultBudget())
	defer cancel()

	l.plan()
	l.watchPVs()
	ends := l.watchPods()

	clock, err := newUptimeClock()
	if err != nil {
		t.Fatal(err)
	}
	l.clock = clock
	agent, agentErr := findAgent(node.Name)
	if agentErr == nil {
		agentErr = l.samples.start(node.Name, agent)
	}
	if agentErr != nil && agentFault(cfg.Fault) {
		t.Fatalf("SOAK_FAULT=%s: %v", cfg.Fault, agentErr)
	}
	samplerCtx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	if agentErr == nil {
		go l.samples.run(samplerCtx, f.Cluster, l.nodeNow, f.Namespace, l.caches)
	} else {
		t.Logf("node agent process: %v; its memory and CPU are not reported", agentErr)
	}
	metricsBefore, metricsErr := l.scrapeMetrics(ctx)

	l.startFault(ctx)
	start := time.Now()
	l.run(ctx, ends)
	close(l.loadDone)
	loadTime := time.Since(start)
	// The fault's injection (the agent's last return, the control plane's
	// restart) must be over before the ends are counted, and before the
	// test can end.
	l.waitFault()
	if t.Failed() {
		stopSampler()
		l.writeReport(ctx, reportInput{loadTime: loadTime, agentErr: agentErr})
		t.FailNow()
	}
	l.collectEnds(ctx)
	l.checkCaches(ctx, agent)
	if cfg.Fault == faultRegistry {
		l.checkRegistry(ctx)
	}
	l.cleanUp(ctx)
	if cfg.Fault != faultNone {
		l.checkQuiet(ctx)
	}
	totalTime := time.Since(start)

	stopSampler()
	// One last reading: the agent that runs now.
	l.samples.sample()
	in := reportInput{loadTime: loadTime, totalTime: totalTime, agent: agent, agentErr: agentErr}
	if metricsErr == nil {
		time.Sleep(time.Second)
		var after *metricsReading
		if after, metricsErr = l.scrapeMetrics(ctx); metricsErr == nil {
			in.writes, in.writesErr = diffWrites(metricsBefore.writes, after.writes)
			in.endDelay, in.endDelayErr = endDelaySince(metricsBefore, after)
		}
	}
	if metricsErr != nil {
		in.writesErr, in.endDelayErr = metricsErr, metricsErr
	}
	rep := l.writeReport(ctx, in)
	if rep.Agent.PeakRSSBytes >= maxRSS {
		t.Errorf("the node agent's RSS peaked at %s, over the loose bound of %s", mib(rep.Agent.PeakRSSBytes), mib(maxRSS))
	}
	if cfg.Fault == faultRegistry {
		l.expectQuiet(ctx)
	}
}

// endTimeout bounds the wait for every volume's end once its pod ended,
// and for claims, PVs and pods to go at the end. Under a fault the
// kubelet's retries of the mounts and unmounts the agent missed back off
// up to about 2 minutes, so the bound grows by that much.
func (l *load) endTimeout() time.Duration {
	if l.cfg.Fault == faultNone {
		return endTimeout
	}
	return endTimeout + 3*time.Minute
}

// faultBudget is the most the fault's injection may take.
func (l *load) faultBudget() time.Duration {
	switch l.cfg.Fault {
	case faultAgentKill, faultAgentOOM:
		return time.Duration(l.cfg.FaultKills) * (l.cfg.FaultEvery + oomBound + agentBackBound + agentReadyBound)
	case faultAPIServer:
		return l.cfg.FaultEvery + l.cfg.FaultDown + time.Minute + controlPlaneBound + transientBound
	case faultNodeRestart:
		return l.cfg.FaultEvery + time.Minute + nodeDaemonsBound + nodeReadyBound
	case faultManagerLeader:
		return l.cfg.FaultEvery + time.Minute + takeoverBound
	case faultRegistry:
		return l.cfg.FaultEvery + l.cfg.FaultDown + 2*registryScriptBound + 2*publishBound + quietSettle + l.cfg.QuietWatch
	}
	return 0
}

type load struct {
	t      *testing.T
	f      *framework.Framework
	cfg    config
	node   framework.Node
	clock  uptimeClock
	caches []string
	builds []*build
	byName map[string]*build

	mu        sync.Mutex
	pvByClaim map[string]string
	pvDeleted map[string]bool

	samples sampler
	// phase2 closes when phase 2 starts, loadDone when both phases are
	// over (or given up): the fault is injected between them.
	phase2, loadDone chan struct{}
	fault            *faultRun
	// lost and extra are the files the caches lacked or held beyond
	// their succeeded builds' (checkCaches), as "cache/file".
	lost, extra []string
	// stragglers are pods that did not end within the bound.
	stragglers []string
	ends       map[string]corev1.Event // by build name
	// eventsLost are builds with no end Event that ended just before a
	// SIGKILL of the agent (killedAfter).
	eventsLost []string
	// endLayers is each cache's depth once the builds stopped.
	endLayers map[string]int
	// endsIn is where watchPods reports pods' ends; reapStranded adds
	// the stranded pods it deletes.
	endsIn chan<- endNote
	// quietWrites are each component's API writes by method in the
	// quiet window after the test's end (checkQuiet).
	quietWrites map[string]map[string]float64
	// reg is the registry fault's state (registry_test.go).
	reg *registryRun
}

// nodeNow is the test's node as it is now: the node-restart fault gives
// it a new process (framework.Node.PID).
func (l *load) nodeNow() framework.Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.node
}

// plan decides every build up front from the seed: its cache, its volume
// kind and whether it fails.
func (l *load) plan() {
	rng := rand.New(rand.NewPCG(uint64(l.cfg.Seed), 0x50a4))
	for i := range l.cfg.Caches {
		l.caches = append(l.caches, fmt.Sprintf("c%d", i))
	}
	l.byName = map[string]*build{}
	total := l.cfg.Concurrent + l.cfg.Builds
	for i := range total {
		b := &build{
			Index:      i,
			Name:       fmt.Sprintf("b-%04d", i),
			Phase:      1,
			Cache:      l.caches[rng.IntN(len(l.caches))],
			ExpectFail: rng.IntN(100) < l.cfg.FailPercent,
			Kept:       i%l.cfg.KeepEvery == l.cfg.KeepEvery-1,
		}
		if i >= l.cfg.Concurrent {
			b.Phase = 2
		}
		switch {
		case l.cfg.Fault == faultManagerLeader && b.Phase == 2 && (i-l.cfg.Concurrent)%standaloneEvery == 0:
			b.Volume = "standalone"
		case l.cfg.Volume == "both":
			b.Volume = []string{"claim", "csi"}[i%2]
		default:
			b.Volume = l.cfg.Volume
		}
		l.builds = append(l.builds, b)
		l.byName[b.Name] = b
	}
}

// pod is build b's pod: non-root, on the test's node, writing its file
// and timing its first and last instruction with /proc/uptime.
func (l *load) pod(b *build) *corev1.Pod {
	code := 0
	if b.ExpectFail {
		code = 1
	}
	script := fmt.Sprintf(`read up rest < /proc/uptime; echo "start $up"
head -c %d /dev/urandom > %s/%s || exit 3
read up rest < /proc/uptime; echo "end $up"
exit %d`, l.cfg.FileBytes, mountPath, b.Name, code)
	pod := framework.BusyboxPod(b.Name, "sh", "-c", script)
	pod.Labels = map[string]string{"soak": "build", "cache": b.Cache, "volume": b.Volume}
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: l.node.Name}
	pod.Spec.SecurityContext = nonRoot()
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: volumeName, MountPath: mountPath}}
	switch b.Volume {
	case "csi":
		pod.Spec.Volumes = []corev1.Volume{csiVolume(b.Cache, false)}
	case "standalone":
		pod.Spec.Volumes = []corev1.Volume{{Name: volumeName, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: b.Name + "-" + volumeName},
		}}}
	default:
		pod.Spec.Volumes = []corev1.Volume{claimVolume(b.Cache, l.storageClass(), false)}
	}
	return pod
}

// storageClass is the class of the builds' claims: the registry's under
// the registry fault, so that their caches sync through it.
func (l *load) storageClass() string {
	if l.cfg.Fault == faultRegistry {
		return l.f.Cluster.Registry.StorageClass
	}
	return v1alpha1.StorageClassName
}

// readVolume is a volume that reads cache and is never committed: a
// read-only CSI volume, or under the registry fault (whose caches refuse
// CSI volumes) a claim of mode read.
func (l *load) readVolume(cache string) corev1.Volume {
	if l.cfg.Fault == faultRegistry {
		return claimVolume(cache, l.storageClass(), true)
	}
	return csiVolume(cache, true)
}

func nonRoot() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{RunAsUser: new(int64(1000)), RunAsGroup: new(int64(1000)), RunAsNonRoot: new(true)}
}

func csiVolume(cache string, readOnly bool) corev1.Volume {
	return corev1.Volume{Name: volumeName, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: v1alpha1.CSIDriverName, ReadOnly: new(readOnly), VolumeAttributes: map[string]string{"cache": cache},
	}}}
}

// claimVolume is a generic ephemeral claim of class for cache; a
// readOnly one has mode read.
func claimVolume(cache, class string, readOnly bool) corev1.Volume {
	annotations := map[string]string{v1alpha1.AnnotationCache: cache}
	if readOnly {
		annotations[v1alpha1.AnnotationMode] = string(v1alpha1.ModeRead)
	}
	return corev1.Volume{Name: volumeName, VolumeSource: corev1.VolumeSource{
		Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Annotations: annotations},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: new(class),
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceStorage: resource.MustParse("1Gi"),
				}},
			},
		}},
	}}
}

// watchPods reports each pod of the namespace once, when it is first seen
// terminal.
func (l *load) watchPods() <-chan endNote {
	ends := make(chan endNote, 2*len(l.builds)+16)
	seen := map[string]bool{}
	var mu sync.Mutex
	factory := informers.NewSharedInformerFactoryWithOptions(l.f.Client, 0, informers.WithNamespace(l.f.Namespace))
	inf := factory.Core().V1().Pods().Informer()
	note := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || (p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[p.Name] {
			return
		}
		seen[p.Name] = true
		exit := "?"
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Terminated != nil {
				exit = strconv.Itoa(int(cs.State.Terminated.ExitCode))
			}
		}
		ends <- endNote{name: p.Name, phase: p.Status.Phase, at: time.Now(), exit: exit}
	}
	l.endsIn = ends
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, o any) { note(o) }}); err != nil {
		l.t.Fatal(err)
	}
	startInformers(l.t, factory)
	return ends
}

// watchPVs remembers the PVs of the namespace's claims, even once deleted.
func (l *load) watchPVs() {
	factory := informers.NewSharedInformerFactoryWithOptions(l.f.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.AnnotationNode }))
	inf := factory.Core().V1().PersistentVolumes().Informer()
	record := func(obj any, deleted bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		pv, ok := obj.(*corev1.PersistentVolume)
		if !ok || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != l.f.Namespace {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.pvByClaim[pv.Spec.ClaimRef.Name] = pv.Name
		if deleted {
			l.pvDeleted[pv.Name] = true
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { record(o, false) },
		UpdateFunc: func(_, o any) { record(o, false) },
		DeleteFunc: func(o any) { record(o, true) },
	})
	if err != nil {
		l.t.Fatal(err)
	}
	startInformers(l.t, factory)
}

// informerFactory is a typed or a dynamic informer factory, whose
// informers are told apart by K.
type informerFactory[K comparable] interface {
	Start(stop <-chan struct{})
	WaitForCacheSync(stop <-chan struct{}) map[K]bool
}

// startInformers starts factory's informers until the test ends and waits
// for their caches.
func startInformers[K comparable](t *testing.T, factory informerFactory[K]) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	factory.Start(stop)
	for typ, ok := range factory.WaitForCacheSync(stop) {
		if !ok {
			t.Fatalf("syncing the %v informer failed", typ)
		}
	}
}

// run does phases 1 and 2 within cfg.Duration.
func (l *load) run(ctx context.Context, ends <-chan endNote) {
	loadCtx, cancel := context.WithTimeout(ctx, l.cfg.Duration)
	defer cancel()
	running := map[string]bool{}
	launch := func(b *build) bool {
		b.Created = time.Now()
		if b.Volume == "standalone" {
			tries := 0
			err := retryTransient(loadCtx, func(ctx context.Context) error {
				tries++
				_, err := l.f.Client.CoreV1().PersistentVolumeClaims(l.f.Namespace).Create(ctx, l.standaloneClaim(b), metav1.CreateOptions{})
				if tries > 1 && apierrors.IsAlreadyExists(err) {
					return nil
				}
				return err
			})
			if err != nil {
				l.t.Errorf("build %d: its standalone claim: %v", b.Index, err)
				return false
			}
		}
		tries := 0
		err := retryTransient(loadCtx, func(ctx context.Context) error {
			tries++
			_, err := l.f.CreatePod(ctx, l.pod(b))
			if tries > 1 && apierrors.IsAlreadyExists(err) {
				return nil // an earlier try was created before its answer was lost
			}
			return err
		})
		if err != nil {
			l.t.Errorf("build %d: %v", b.Index, err)
			return false
		}
		running[b.Name] = true
		return true
	}
	wait := func(phase string, pending func() bool) bool {
		for pending() {
			select {
			case n := <-ends:
				if !running[n.name] {
					continue
				}
				delete(running, n.name)
				l.finish(loadCtx, n)
				if !pending() {
					return true
				}
			case <-loadCtx.Done():
				l.stragglers = slices.Sorted(maps.Keys(running))
				l.t.Errorf("%s: %d pods did not end within SOAK_DURATION %s: %v", phase, len(running), l.cfg.Duration, l.stragglers)
				l.logVolumeWarnings()
				return false
			}
		}
		return true
	}

	c := l.cfg.Concurrent
	t1 := time.Now()
	for _, b := range l.builds[:c] {
		if !launch(b) {
			return
		}
	}
	if !wait("phase 1", func() bool { return len(running) > 0 }) {
		return
	}
	l.t.Logf("phase 1: %d pods at once ended in %s", c, time.Since(t1).Round(time.Millisecond))

	t2 := time.Now()
	close(l.phase2)
	churn := l.builds[c:]
	next := 0
	for ; next < min(c, len(churn)); next++ {
		if !launch(churn[next]) {
			return
		}
	}
	for len(running) > 0 {
		before := len(running)
		if !wait("phase 2", func() bool { return len(running) == before }) {
			return
		}
		for ; next < len(churn) && len(running) < c; next++ {
			if !launch(churn[next]) {
				return
			}
		}
		if l.t.Failed() && len(l.failures()) > 20 {
			l.t.Errorf("giving up after %d failed builds", len(l.failures()))
			return
		}
	}
	l.t.Logf("phase 2: %d builds, at most %d at once, ended in %s", len(churn), c, time.Since(t2).Round(time.Millisecond))
}

// interrupted tells whether the pod of n was killed, or its result lost,
// by node-reboot or node-restart: it ended Failed after the fault began
// with an exit code that is none of the build's script (0, 1, or 3 when
// its write failed). The kubelet reports the container the reboot took
// with none it saw, or SIGKILL's; a container whose start containerd's
// restart cut short ends with 128 (StartError), and one whose shim the
// new containerd cannot reach with 255 (its unknown exit status), even if
// the build itself finished. Either way the pod failed, and its volume
// must be discarded.
func (l *load) interrupted(n endNote) bool {
	if n.exit == exitStranded {
		return true
	}
	if !nodeFault(l.cfg.Fault) || n.phase != corev1.PodFailed || slices.Contains([]string{"0", "1", "3"}, n.exit) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.fault.started.IsZero() && n.at.After(l.fault.started)
}

func (l *load) failures() []string {
	var out []string
	for _, b := range l.builds {
		if !b.SeenEnd.IsZero() && !b.Interrupted && (b.Started.IsZero() || b.Ended.IsZero()) {
			out = append(out, b.Name)
		}
	}
	return out
}

var uptimeLine = regexp.MustCompile(`(?m)^(start|end) ([0-9.]+)$`)

// finish handles a pod's end: its phase must be the decided one; its
// timestamps come from its log; then it is deleted unless kept.
func (l *load) finish(ctx context.Context, n endNote) {
	b := l.byName[n.name]
	b.SeenEnd = n.at
	b.Interrupted = l.interrupted(n)
	if n.exit == exitStranded {
		// Deleted by reapStranded: it never ran, so it has no log.
		return
	}
	want := corev1.PodSucceeded
	if b.ExpectFail || b.Interrupted {
		want = corev1.PodFailed
	}
	if n.phase != want {
		l.t.Errorf("pod %s ended %s (exit %s), want %s", b.Name, n.phase, n.exit, want)
	}
	logs, err := l.podLog(ctx, b)
	switch {
	case err != nil && b.Interrupted:
		l.t.Logf("pod %s, killed by the fault: no log: %v", b.Name, err)
	case err != nil:
		l.t.Errorf("pod %s: %v", b.Name, err)
	}
	for _, m := range uptimeLine.FindAllStringSubmatch(logs, -1) {
		up, err := parseUptime(m[2])
		if err != nil {
			l.t.Errorf("pod %s: %v", b.Name, err)
			continue
		}
		if m[1] == "start" {
			b.Started = l.clock.at(up)
		} else {
			b.Ended = l.clock.at(up)
		}
	}
	if logs == "" && nodeFault(l.cfg.Fault) && !b.Interrupted {
		// A pod that ended around the fault: the kubelet that comes back
		// may serve its log empty. Its outcome still counts (its phase
		// above, its volume's end and its cache's files); only its times
		// are lost.
		l.t.Logf("pod %s (%s, exit %s): its log is empty after the %s; its times are not reported", b.Name, n.phase, n.exit, l.cfg.Fault)
		l.deleteUnlessKept(ctx, b)
		return
	}
	if (b.Started.IsZero() || b.Ended.IsZero()) && !b.Interrupted {
		l.t.Errorf("pod %s (%s, exit %s): no start and end times in its log %q", b.Name, n.phase, n.exit, logs)
	}
	l.deleteUnlessKept(ctx, b)
}

// emptyLogTries bounds the reads of a log that comes back empty: the
// kubelet may serve a container's log before its last lines are in the
// file. Three reads a second apart were too few on a cold CI machine
// with four e2e packages side by side: a build that had committed its
// volume still had an empty log 3 s after it ended.
const emptyLogTries = 10

// podLog reads the build's log, again while it is empty (a few times, a
// second apart) or the kubelet is away during a node fault.
func (l *load) podLog(ctx context.Context, b *build) (string, error) {
	var logs string
	var err error
	for try := 1; try <= emptyLogTries; try++ {
		logs, err = l.readPodLog(ctx, b)
		if err != nil || logs != "" || try == emptyLogTries || !sleepCtx(ctx, time.Second) {
			break
		}
	}
	return logs, err
}

func (l *load) readPodLog(ctx context.Context, b *build) (string, error) {
	var logs string
	err := retryTransient(ctx, func(ctx context.Context) error {
		var err error
		logs, err = l.f.PodLogs(ctx, b.Name, "main")
		if err != nil && nodeFault(l.cfg.Fault) && apierrors.IsNotFound(err) && ctx.Err() == nil {
			// The kubelet serves the logs: while node-restart or
			// node-reboot has it stopped, the API server answers 404
			// for pods/log. Not an API status any more, so
			// retryTransient retries it.
			return fmt.Errorf("%s (the kubelet may be restarting)", err.Error())
		}
		return err
	})
	return logs, err
}

// deleteUnlessKept deletes build b's ended pod, as CI systems do, unless
// the test keeps it.
func (l *load) deleteUnlessKept(ctx context.Context, b *build) {
	if b.Kept {
		return
	}
	err := retryTransient(ctx, func(ctx context.Context) error {
		return l.f.Client.CoreV1().Pods(l.f.Namespace).Delete(ctx, b.Name, metav1.DeleteOptions{})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		l.t.Errorf("deleting pod %s: %v", b.Name, err)
	}
}

var volumeIDPattern = regexp.MustCompile(`\b(csi-[0-9a-f]{40}|pvc-[0-9a-f-]{36})\b`)

var endReasons = []string{"Committed", "Discarded", "CommitDropped", "CommitOverLimit", "CommitTorn"}

// collectEnds waits until the volume of every build has ended, then checks
// each ended once, as its pod's outcome says. A claim's end is told on the
// claim, or on its PV if the claim went first; a CSI volume's on its pod.
func (l *load) collectEnds(ctx context.Context) {
	var missing []string
	byBuild := map[string][]corev1.Event{}
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, time.Second, l.endTimeout(), true, func(ctx context.Context) (bool, error) {
		nsEvents, err := l.f.Client.CoreV1().Events(l.f.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, keepPolling(ctx, err, &lastErr)
		}
		pvEvents, err := l.f.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.kind", "PersistentVolume").String(),
		})
		if err != nil {
			return false, keepPolling(ctx, err, &lastErr)
		}
		l.mu.Lock()
		claimOfPV := map[string]string{}
		for c, pv := range l.pvByClaim {
			claimOfPV[pv] = c
		}
		l.mu.Unlock()
		byBuild = map[string][]corev1.Event{}
		for _, ev := range append(nsEvents.Items, pvEvents.Items...) {
			if !slices.Contains(endReasons, ev.Reason) {
				continue
			}
			name := ""
			switch ev.InvolvedObject.Kind {
			case "Pod":
				name = ev.InvolvedObject.Name
			case "PersistentVolumeClaim":
				name = strings.TrimSuffix(ev.InvolvedObject.Name, "-"+volumeName)
			case "PersistentVolume":
				name = strings.TrimSuffix(claimOfPV[ev.InvolvedObject.Name], "-"+volumeName)
			}
			if l.byName[name] != nil {
				byBuild[name] = append(byBuild[name], ev)
			}
		}
		missing, l.eventsLost = missing[:0], l.eventsLost[:0]
		for _, b := range l.builds {
			switch {
			case len(byBuild[b.Name]) > 0:
			case l.killedAfter(b.Ended):
				l.eventsLost = append(l.eventsLost, b.Name)
			default:
				missing = append(missing, b.Name)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		l.t.Errorf("%d volumes did not end within %s: %v (last API error: %v): %v", len(missing), l.endTimeout(), err, lastErr, missing)
	}
	if len(l.eventsLost) > 0 {
		// Events are best-effort: the agent sends them from a buffer,
		// which a SIGKILL loses. What became of these volumes is still
		// checked, by the caches' contents.
		l.t.Logf("%d builds that ended less than %s before a SIGKILL of the agent have no end Event: %v", len(l.eventsLost), eventLossWindow, l.eventsLost)
	}
	l.ends = map[string]corev1.Event{}
	for _, b := range l.builds {
		evs := byBuild[b.Name]
		if len(evs) == 0 {
			continue
		}
		ev := evs[0]
		if len(evs) > 1 || ev.Count > 1 || ev.Series != nil {
			l.t.Errorf("the volume of build %s ended more than once: %d Events, first %s %q count %d", b.Name, len(evs), ev.Reason, ev.Message, ev.Count)
		}
		l.ends[b.Name] = ev
		b.EndReason = ev.Reason
		if m := volumeIDPattern.FindString(ev.Message); m != "" {
			b.VolumeID = m
		}
		switch {
		case !ev.EventTime.IsZero():
			b.VolumeEnded = ev.EventTime.Time
		case !ev.LastTimestamp.IsZero():
			b.VolumeEnded = ev.LastTimestamp.Time
		default:
			b.VolumeEnded = ev.FirstTimestamp.Time
		}
		if b.Volume == "claim" || b.Volume == "standalone" {
			l.mu.Lock()
			b.PV = l.pvByClaim[b.Name+"-"+volumeName]
			l.mu.Unlock()
		}
		if ev.Reason != b.wantReason() {
			l.t.Errorf("the volume of build %s (%s, expected to %s): %s %q, want %s",
				b.Name, b.Volume, map[bool]string{true: "fail", false: "succeed"}[b.ExpectFail], ev.Reason, ev.Message, b.wantReason())
		}
	}
}

// eventLossWindow is how long after a build's end a SIGKILL of the agent
// may take the build's end Event along: the end itself (a commit under
// load takes seconds) and the Event buffer's flush.
const eventLossWindow = 30 * time.Second

// killedAfter tells whether the agent-kill fault killed the agent within
// eventLossWindow after ended.
func (l *load) killedAfter(ended time.Time) bool {
	if l.fault == nil || !agentFault(l.fault.Kind) || ended.IsZero() {
		return false
	}
	for _, ev := range l.fault.Events {
		if !ev.At.Before(ended) && ev.At.Sub(ended) <= eventLossWindow {
			return true
		}
	}
	return false
}

// checkCaches reads every cache on the test's node with a check pod (a
// volume never committed): it must hold exactly the files of its
// succeeded builds, each of FileBytes; the node's head must count them as
// generations and stay within the agent's --max-layers.
func (l *load) checkCaches(ctx context.Context, agent agentProc) {
	l.endLayers = map[string]int{}
	want := l.wantFiles()
	got := l.readCaches(ctx, l.node, "check-")
	maxLayers := agent.MaxLays
	if maxLayers == 0 {
		maxLayers = 32
	}
	for _, c := range l.caches {
		lines, ok := got[c]
		if !ok {
			continue // its check pod failed, and said so
		}
		w := want[c]
		if lost, extra := minus(w, lines), minus(lines, w); len(lost)+len(extra) > 0 {
			for _, x := range lost {
				l.lost = append(l.lost, c+"/"+strings.Fields(x)[0])
			}
			for _, x := range extra {
				l.extra = append(l.extra, c+"/"+strings.Fields(x)[0])
			}
			l.t.Errorf("cache %s holds %d files, want the %d of its succeeded builds:\nlost:  %v\nextra: %v",
				c, len(lines), len(w), lost, extra)
		}
		// Once the builds have stopped, the background squash must bring
		// every cache within --max-layers.
		var h *head
		err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			h, err = readHead(ctx, l.f.Cluster, l.node, l.f.Namespace, c)
			return err == nil && len(h.Layers) <= maxLayers, nil
		})
		if h == nil {
			if len(w) > 0 {
				l.t.Errorf("cache %s: no head on the node: %v", c, err)
			}
			continue
		}
		l.endLayers[c] = len(h.Layers)
		if h.Generation != int64(len(w)) {
			l.t.Errorf("cache %s is at generation %d on the node, want %d (one per succeeded build)", c, h.Generation, len(w))
		}
		if len(h.Layers) > maxLayers {
			l.t.Errorf("cache %s has %d layers 30 s after the last build, over --max-layers %d: squash did not run", c, len(h.Layers), maxLayers)
		}
	}
	// While builds commit, a squash merges the layers it started from and
	// the commits that land meanwhile stay above it: at most one per
	// running build.
	if p := l.samples.PeakLayers; p > maxLayers+max(layerSlack, l.cfg.Concurrent) {
		l.t.Errorf("cache %s was seen with %d layers, over --max-layers %d + %d: squash does not keep up", l.samples.PeakCache, p, maxLayers, max(layerSlack, l.cfg.Concurrent))
	}
}

// wantFiles is what each cache must hold: "NAME BYTES" of its succeeded
// builds' files, sorted.
func (l *load) wantFiles() map[string][]string {
	want := map[string][]string{}
	for _, b := range l.builds {
		if !b.ExpectFail && !b.Interrupted {
			want[b.Cache] = append(want[b.Cache], fmt.Sprintf("%s %d", b.Name, l.cfg.FileBytes))
		}
	}
	for _, files := range want {
		slices.Sort(files)
	}
	return want
}

// readCaches lists the files of every cache as pod PREFIX+CACHE on node
// sees them through readVolume, as "NAME BYTES", sorted. A cache whose
// pod failed is missing from the result; the test says why.
func (l *load) readCaches(ctx context.Context, node framework.Node, prefix string) map[string][]string {
	for _, c := range l.caches {
		name := prefix + c
		pod := framework.BusyboxPod(name, "sh", "-c", `cd /cache && for f in $(ls -1A); do echo "$f $(wc -c < "$f")"; done`)
		pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node.Name}
		pod.Spec.SecurityContext = nonRoot()
		pod.Spec.Volumes = []corev1.Volume{l.readVolume(c)}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: volumeName, MountPath: mountPath, ReadOnly: true}}
		if _, err := l.f.CreatePod(ctx, pod); err != nil {
			l.t.Fatal(err)
		}
	}
	got := map[string][]string{}
	for _, c := range l.caches {
		name := prefix + c
		if _, err := l.f.WaitForPodPhase(ctx, name, corev1.PodSucceeded); err != nil {
			l.t.Errorf("check of cache %s on node %s: %v", c, node.Name, err)
			continue
		}
		logs, err := l.f.PodLogs(ctx, name, "main")
		if err != nil {
			l.t.Errorf("check of cache %s on node %s: %v", c, node.Name, err)
			continue
		}
		lines := []string{}
		for line := range strings.Lines(logs) {
			if line = strings.TrimSpace(line); line != "" {
				lines = append(lines, strings.Join(strings.Fields(line), " "))
			}
		}
		slices.Sort(lines)
		got[c] = lines
	}
	return got
}

func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// cleanUp deletes the kept pods and the check pods, then checks that the
// namespace's pods, claims and PVs all go and that none of the builds'
// volumes is left in the node's store.
func (l *load) cleanUp(ctx context.Context) {
	pods := l.f.Client.CoreV1().Pods(l.f.Namespace)
	err := retryTransient(ctx, func(ctx context.Context) error {
		return pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	if err != nil {
		l.t.Fatalf("deleting the kept pods: %v", err)
	}
	// Standalone claims (manager-leader) are the test's to delete, once
	// their volumes have ended (collectEnds).
	for _, b := range l.builds {
		if b.Volume != "standalone" {
			continue
		}
		err := retryTransient(ctx, func(ctx context.Context) error {
			return l.f.Client.CoreV1().PersistentVolumeClaims(l.f.Namespace).Delete(ctx, b.Name+"-"+volumeName, metav1.DeleteOptions{})
		})
		if err != nil && !apierrors.IsNotFound(err) {
			l.t.Errorf("deleting the standalone claim of build %s: %v", b.Name, err)
		}
	}
	var state string
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, time.Second, l.endTimeout(), true, func(ctx context.Context) (bool, error) {
		ps, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, keepPolling(ctx, err, &lastErr)
		}
		claims, err := l.f.Client.CoreV1().PersistentVolumeClaims(l.f.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, keepPolling(ctx, err, &lastErr)
		}
		l.mu.Lock()
		var pvs []string
		for _, pv := range l.pvByClaim {
			if !l.pvDeleted[pv] {
				pvs = append(pvs, pv)
			}
		}
		l.mu.Unlock()
		var cs []string
		for _, c := range claims.Items {
			cs = append(cs, fmt.Sprintf("%s (%s, finalizers %v)", c.Name, c.Status.Phase, c.Finalizers))
		}
		state = fmt.Sprintf("%d pods, claims %v, PVs %v", len(ps.Items), cs, pvs)
		return len(ps.Items) == 0 && len(cs) == 0 && len(pvs) == 0, nil
	})
	if err != nil {
		l.t.Errorf("pods, claims or PVs left stuck %s after the last pod was deleted: %s (last API error: %v)", l.endTimeout(), state, lastErr)
	}
	// Every volume of the namespace's caches must have left the store:
	// volume.json names its cache, whether or not its end was told.
	// Every node: the registry fault's check pods ran on the second.
	for _, node := range l.f.Cluster.Nodes {
		var left []string
		err = wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			left, err = l.volumesLeft(ctx, node)
			return err == nil && len(left) == 0, err
		})
		if err != nil {
			l.t.Errorf("volumes of the test's caches left in the store of node %s with their pods and claims gone: %v (%v)", node.Name, left, err)
		}
	}
}

// volumesLeft lists the volumes in node's store whose cache is in the
// test's namespace.
func (l *load) volumesLeft(ctx context.Context, node framework.Node) ([]string, error) {
	out, err := l.f.Cluster.NodeExec(ctx, node, "ls", "-1A", storeRoot+"/volumes")
	if err != nil {
		return nil, fmt.Errorf("listing the volumes of node %s: %w", node.Name, err)
	}
	var left []string
	for _, id := range strings.Fields(out) {
		raw, err := l.f.Cluster.ReadNodeFile(ctx, node, storeRoot+"/volumes/"+id+"/volume.json")
		if err != nil {
			continue // being removed, or not a volume
		}
		var v struct {
			Cache  string `json:"cache"`
			Writer string `json:"writer"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("volume %s: %w", id, err)
		}
		if strings.HasPrefix(v.Cache, l.f.Namespace+"/") {
			left = append(left, fmt.Sprintf("%s (cache %s, writer %s)", id, v.Cache, v.Writer))
		}
	}
	return left, nil
}

// metricsReading is one reading of the node agent's and the managers'
// metrics.
type metricsReading struct {
	// writes are rest_client_requests_total by component.
	writes map[string]bench.Requests
	// endDelay is the node agent's endDelayMetric, unless endDelayErr
	// says why not (an agent built before it).
	endDelay    bench.Histogram
	endDelayErr error
}

// endDelayMetric is the node agent's histogram of its share of a build's
// end: from its pod watch seeing the pod end to the volume's end.
const endDelayMetric = "layercache_volume_end_delay_seconds"

// scrapeMetrics reads the metrics of the node's agent and of every
// manager replica, once each.
func (l *load) scrapeMetrics(ctx context.Context) (*metricsReading, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out := &metricsReading{writes: map[string]bench.Requests{}}
	for _, comp := range []string{framework.ComponentNode, framework.ComponentManager} {
		node := ""
		if comp == framework.ComponentNode {
			node = l.node.Name
		}
		pages, err := l.f.ComponentMetrics(ctx, comp, node)
		if err != nil {
			return nil, err
		}
		sum := bench.Requests{}
		for pod, page := range pages {
			r, err := bench.ParseRequests(page)
			if err != nil {
				return nil, fmt.Errorf("pod %s: %w", pod, err)
			}
			for k, v := range r {
				sum[k] += v
			}
			if comp == framework.ComponentNode {
				out.endDelay, out.endDelayErr = bench.ParseHistogram(page, endDelayMetric)
			}
		}
		out.writes[comp] = sum
	}
	return out, nil
}

// endDelaySince is the node agent's endDelayMetric between two readings.
func endDelaySince(before, after *metricsReading) (bench.Histogram, error) {
	if err := errors.Join(before.endDelayErr, after.endDelayErr); err != nil {
		return bench.Histogram{}, err
	}
	return after.endDelay.Sub(before.endDelay)
}

func diffWrites(before, after map[string]bench.Requests) (map[string]map[string]float64, error) {
	out := map[string]map[string]float64{}
	for comp, a := range after {
		d, err := a.Sub(before[comp])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", comp, err)
		}
		out[comp] = d.Writes()
	}
	return out, nil
}

// logVolumeWarnings writes the PVs' Warning Events to the test log (the
// namespace's dump has the pods' and claims'): why a straggler's volume
// was not set up again, for one, is a RemountFailed Event on its PV.
func (l *load) logVolumeWarnings() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := l.f.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PersistentVolume,type=Warning"})
	if err != nil {
		l.t.Logf("listing the PVs' Warning Events: %v", err)
		return
	}
	for _, e := range events.Items {
		l.t.Logf("event PersistentVolume/%s: %s (%d times, last %s): %s", e.InvolvedObject.Name, e.Reason, e.Count, e.LastTimestamp.UTC().Format(time.RFC3339), e.Message)
	}
}
