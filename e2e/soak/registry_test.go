//go:build e2e

package soak

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
	"github.com/layercache/layercache/internal/bootstrap"
)

// The registry fault (SOAK_FAULT=registry) stops the registry of a
// two-node cluster (make up NODES=2) for FaultDown during phase 2. The
// builds stay on node 1, as in every fault, with claims of the registry's
// StorageClass, so that node 1 publishes every commit and node 2 only
// reads: the chain then has one writer, and "published at node 1's
// generation" is an exact check. Builds on node 2 as well would make the
// chain interleave two nodes' commits, which TestConcurrentBuildsOnTwoNodesConverge
// (e2e/multinode) covers; here the point is node 1's backlog. After the
// load: every cache on node 1 holds its succeeded builds' files (as in
// every fault); node 1 published everything it committed, the outage's
// commits too, with no error left; a pod on node 2 reads the same files;
// no volume, claim or PV is left on either node; the agent wrote no more
// during the outage than per commit, and made few RegistryFailed Events;
// and nothing writes to the namespace afterwards.

const (
	// registryScriptBound bounds registry.sh stop or start (the
	// framework's own bound).
	registryScriptBound = 2 * time.Minute
	// publishBound bounds the wait for node 1's commits to be in the
	// chains once the registry answers: the agent's publish retries back
	// off up to 16 s, then wait for its periodic pass (every minute).
	publishBound = 3 * time.Minute
	// quietSettle bounds the wait for layercache's objects in the
	// namespace to settle after the clean-up, before they are watched for
	// SOAK_QUIET_WATCH.
	quietSettle = 2 * time.Minute
	// registryFailedPerCache bounds the RegistryFailed Events per cache of
	// one outage: one per distinct failure (a push cut off mid-way, then
	// refused connections), not one per retry.
	registryFailedPerCache = 3
	// writesPerBuild and writesPerCache bound the agent's writes of
	// Caches' chains and of its CacheReplicas while the registry is away:
	// each build's volume is announced and reported at its mount and its
	// end, and each cache's failure is reported once. More is a storm.
	writesPerBuild = 6
	writesPerCache = 4
)

// registryRun is the registry fault's state.
type registryRun struct {
	client client.Client // Caches and CacheReplicas, typed
	other  framework.Node
	mu     sync.Mutex
	// chainWrites and replicaWrites are when the watch saw a change of a
	// Cache's status.published or of one of node 1's CacheReplicas.
	chainWrites, replicaWrites []time.Time
	watchFrom                  time.Time
}

// registryFigures are the registry fault's figures after the load.
type registryFigures struct {
	// Outage is the registry's outage, Rest the rest of the run up to the
	// publish check (the backlog's publish included).
	Outage activity `json:"outage"`
	Rest   activity `json:"rest"`
	// RegistryFailed counts the RegistryFailed Events, their repeats
	// included; RegistryFailedNotes are their distinct messages.
	RegistryFailed      int      `json:"registryFailedEvents"`
	RegistryFailedNotes []string `json:"registryFailedNotes,omitempty"`
	// Generations is each cache's generation on node 1, published.
	Generations map[string]int64 `json:"generations"`
	// OtherNode is the node that read the caches at the end; OtherLost and
	// OtherExtra are the files it saw missing or beyond the succeeded
	// builds', as "cache/file".
	OtherNode  string   `json:"otherNode"`
	OtherLost  []string `json:"otherLost"`
	OtherExtra []string `json:"otherExtra"`
}

// activity is what happened in a time window: builds whose volume ended
// (committed or discarded) and node 1's agent's writes.
type activity struct {
	Seconds       float64 `json:"seconds"`
	Ends          int     `json:"volumeEnds"`
	Commits       int     `json:"commits"`
	ChainWrites   int     `json:"chainWrites"`
	ReplicaWrites int     `json:"replicaWrites"`
}

func (a activity) writes() int { return a.ChainWrites + a.ReplicaWrites }

// requireRegistry fails the test unless the cluster has two nodes and the
// registry: the fault has nothing to show on one node.
func (l *load) requireRegistry() {
	c := l.f.Cluster
	if len(c.Nodes) < 2 || c.Registry == nil {
		l.t.Fatalf("SOAK_FAULT=registry needs two nodes and the registry (cluster.json has %d node(s), registry %v): start the cluster with `make up NODES=2`",
			len(c.Nodes), c.Registry != nil)
	}
}

// startRegistryRun makes the registry fault's client, starts counting the
// agent's writes and registers the registry's start at cleanup: the
// cluster is shared, and start keeps a registry that runs.
func (l *load) startRegistryRun() {
	scheme, err := bootstrap.Scheme()
	if err != nil {
		l.t.Fatal(err)
	}
	c, err := client.New(l.f.Config, client.Options{Scheme: scheme})
	if err != nil {
		l.t.Fatal(err)
	}
	l.reg = &registryRun{client: c, other: l.f.Cluster.Nodes[1], watchFrom: time.Now()}
	l.t.Cleanup(func() {
		if err := l.f.Cluster.StartRegistry(context.Background()); err != nil {
			l.t.Errorf("starting the registry again at cleanup: %v", err)
		}
	})
	l.watchAgentWrites()
}

// watchAgentWrites records when the watch sees node 1's agent write: a
// change of a Cache's chain (status.published: announcements, appends;
// only node 1 commits) or of one of node 1's CacheReplicas. The watch
// counts this namespace's writes only; the agent's metrics would count
// every namespace's, and other scenarios may share the cluster.
func (l *load) watchAgentWrites() {
	dyn, err := dynamic.NewForConfig(l.f.Config)
	if err != nil {
		l.t.Fatal(err)
	}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, l.f.Namespace, nil)
	note := func(to *[]time.Time) {
		l.reg.mu.Lock()
		defer l.reg.mu.Unlock()
		*to = append(*to, time.Now())
	}
	handlers := []struct {
		resource string
		changed  func(old, cur *unstructured.Unstructured) bool
		to       *[]time.Time
	}{
		{"caches", func(old, cur *unstructured.Unstructured) bool {
			return old == nil || !equality.Semantic.DeepEqual(published(old), published(cur))
		}, &l.reg.chainWrites},
		{"cachereplicas", func(old, cur *unstructured.Unstructured) bool {
			node, _, _ := unstructured.NestedString(cur.Object, "spec", "node")
			return node == l.node.Name && (old == nil || old.GetResourceVersion() != cur.GetResourceVersion())
		}, &l.reg.replicaWrites},
	}
	for _, h := range handlers {
		inf := factory.ForResource(v1alpha1.GroupVersion.WithResource(h.resource)).Informer()
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) {
				if cur, ok := o.(*unstructured.Unstructured); ok && h.changed(nil, cur) {
					note(h.to)
				}
			},
			UpdateFunc: func(o, n any) {
				old, ok1 := o.(*unstructured.Unstructured)
				cur, ok2 := n.(*unstructured.Unstructured)
				if ok1 && ok2 && h.changed(old, cur) {
					note(h.to)
				}
			},
		})
		if err != nil {
			l.t.Fatal(err)
		}
	}
	startInformers(l.t, factory)
}

// published is a Cache's status.published, nil if it has none.
func published(u *unstructured.Unstructured) any {
	v, _, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "published")
	return v
}

// registryOutage stops the registry FaultEvery after phase 2's start,
// keeps it down FaultDown and starts it again, even if the test is being
// cancelled (the cluster is shared); then it waits until node 1 has
// published what it committed meanwhile.
func (l *load) registryOutage(ctx context.Context) {
	if !sleepCtx(ctx, l.cfg.FaultEvery) {
		l.fault.Note = "the test ended before the outage"
		return
	}
	ev := faultEvent{At: time.Now(), DuringLoad: l.loadRunning()}
	defer func() {
		l.mu.Lock()
		l.fault.Events = append(l.fault.Events, ev)
		l.mu.Unlock()
	}()
	always := context.WithoutCancel(ctx)
	if err := l.f.Cluster.StopRegistry(always); err != nil {
		l.failEvent(&ev, "%v", err)
		return
	}
	ev.Stopping = time.Since(ev.At)
	l.t.Logf("registry: stopped at %s in %s (load running: %v); down for %s",
		ev.At.UTC().Format("15:04:05.000"), ev.Stopping.Round(time.Millisecond), ev.DuringLoad, l.cfg.FaultDown)
	time.Sleep(l.cfg.FaultDown)
	if err := l.f.Cluster.StartRegistry(always); err != nil {
		ev.Back = time.Since(ev.At)
		l.failEvent(&ev, "%v", err)
		return
	}
	ev.Back = time.Since(ev.At)
	backlog, took, err := l.drainBacklog(ctx)
	ev.Backlog, ev.Published = backlog, took
	if err != nil {
		l.failEvent(&ev, "%v", err)
		return
	}
	l.t.Logf("registry: answering again %s after the stop; node 1's backlog of %d generation(s) published %s later",
		ev.Back.Round(time.Millisecond), backlog, took.Round(time.Millisecond))
}

// drainBacklog waits until every generation node 1 had committed when
// the registry answered again is in its Cache's chain; it returns how
// many were not yet, and how long they took.
func (l *load) drainBacklog(ctx context.Context) (int64, time.Duration, error) {
	start := time.Now()
	want := map[string]int64{}
	for _, c := range l.caches {
		if h, err := readHead(ctx, l.f.Cluster, l.node, l.f.Namespace, c); err == nil {
			want[c] = h.Generation
		}
	}
	backlog := int64(-1)
	var state string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, publishBound, true, func(ctx context.Context) (bool, error) {
		var behind int64
		state = ""
		for c, gen := range want {
			var cache v1alpha1.Cache
			if err := l.reg.client.Get(ctx, client.ObjectKey{Namespace: l.f.Namespace, Name: c}, &cache); err != nil {
				state = err.Error()
				return false, nil
			}
			pub := publishedGeneration(&cache)
			behind += max(gen-pub, 0)
			state += fmt.Sprintf(" %s %d/%d", c, pub, gen)
		}
		if backlog < 0 {
			backlog = behind
		}
		return behind == 0, nil
	})
	if err != nil {
		return max(backlog, 0), time.Since(start), fmt.Errorf("node 1's commits from before the registry's return were not all published within %s: %w (published/committed:%s)", publishBound, err, state)
	}
	return max(backlog, 0), time.Since(start), nil
}

func publishedGeneration(c *v1alpha1.Cache) int64 {
	if c.Status.Published == nil {
		return 0
	}
	return c.Status.Published.Generation
}

// checkRegistry checks, once the builds' volumes have ended, that node 1
// published every generation it committed and that node 2 reads the same
// files, and puts the figures on the fault's report.
func (l *load) checkRegistry(ctx context.Context) {
	fig := &registryFigures{OtherNode: l.reg.other.Name}
	fig.Generations = l.checkPublished(ctx)
	l.measureOutage(ctx, fig)
	got := l.readCaches(ctx, l.reg.other, "check2-")
	want := l.wantFiles()
	for _, c := range l.caches {
		lines, ok := got[c]
		if !ok {
			continue
		}
		lost, extra := minus(want[c], lines), minus(lines, want[c])
		for _, x := range lost {
			fig.OtherLost = append(fig.OtherLost, c+"/"+strings.Fields(x)[0])
		}
		for _, x := range extra {
			fig.OtherExtra = append(fig.OtherExtra, c+"/"+strings.Fields(x)[0])
		}
		if len(lost)+len(extra) > 0 {
			l.t.Errorf("node %s reads cache %s with %d files, want the %d of its succeeded builds:\nlost:  %v\nextra: %v",
				fig.OtherNode, c, len(lines), len(want[c]), lost, extra)
		}
	}
	l.mu.Lock()
	l.fault.Registry = fig
	l.mu.Unlock()
}

// checkPublished waits until each cache's chain is at node 1's generation,
// with no announcement left, and node 1's CacheReplica says nothing is
// unpublished and no publish failed; it returns the generations.
func (l *load) checkPublished(ctx context.Context) map[string]int64 {
	gens := map[string]int64{}
	var state []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, publishBound, true, func(ctx context.Context) (bool, error) {
		state = state[:0]
		for _, c := range l.caches {
			h, err := readHead(ctx, l.f.Cluster, l.node, l.f.Namespace, c)
			if err != nil {
				continue // no build of it succeeded
			}
			gens[c] = h.Generation
			if s := l.publishState(ctx, c, h.Generation); s != "" {
				state = append(state, s)
			}
		}
		return len(state) == 0, nil
	})
	if err != nil {
		l.t.Errorf("node %s's commits not all published %s after the builds' ends: %v: %s", l.node.Name, publishBound, err, strings.Join(state, "; "))
	}
	return gens
}

// publishState says what is not yet published of cache c at node 1's
// generation gen; "" if all is.
func (l *load) publishState(ctx context.Context, c string, gen int64) string {
	var cache v1alpha1.Cache
	if err := l.reg.client.Get(ctx, client.ObjectKey{Namespace: l.f.Namespace, Name: c}, &cache); err != nil {
		return fmt.Sprintf("Cache %s: %v", c, err)
	}
	var r v1alpha1.CacheReplica
	key := client.ObjectKey{Namespace: l.f.Namespace, Name: v1alpha1.CacheReplicaName(c, l.node.Name)}
	if err := l.reg.client.Get(ctx, key, &r); err != nil {
		return fmt.Sprintf("CacheReplica %s: %v", key.Name, err)
	}
	pub, st := cache.Status.Published, r.Status
	announced := 0
	if pub != nil {
		announced = len(pub.Announced)
	}
	if publishedGeneration(&cache) == gen && announced == 0 && st.Generation == gen && st.Unpublished == 0 && st.PublishError == "" {
		return ""
	}
	return fmt.Sprintf("cache %s at generation %d on the node: chain at %d with %d announcement(s); replica at %d, unpublished %d, publishError %q",
		c, gen, publishedGeneration(&cache), announced, st.Generation, st.Unpublished, st.PublishError)
}

// measureOutage counts the agent's writes and the volumes' ends during the
// outage and the rest of the run, and the RegistryFailed Events, and fails
// the test on a storm of either.
func (l *load) measureOutage(ctx context.Context, fig *registryFigures) {
	l.mu.Lock()
	evs := slices.Clone(l.fault.Events)
	l.mu.Unlock()
	if len(evs) != 1 {
		return // no outage: waitFault said why
	}
	from, to := evs[0].At, evs[0].At.Add(evs[0].Back)
	l.reg.mu.Lock()
	fig.Outage = l.reg.window(from, to)
	all := l.reg.window(l.reg.watchFrom, time.Now())
	l.reg.mu.Unlock()
	fig.Rest = activity{Seconds: all.Seconds - fig.Outage.Seconds,
		ChainWrites: all.ChainWrites - fig.Outage.ChainWrites, ReplicaWrites: all.ReplicaWrites - fig.Outage.ReplicaWrites}
	for _, b := range l.builds {
		if b.VolumeEnded.IsZero() {
			continue
		}
		a := &fig.Rest
		if !b.VolumeEnded.Before(from) && b.VolumeEnded.Before(to) {
			a = &fig.Outage
		}
		a.Ends++
		if b.EndReason == "Committed" {
			a.Commits++
		}
	}
	if bound := writesPerBuild*fig.Outage.Ends + writesPerCache*len(l.caches); fig.Outage.writes() > bound {
		l.t.Errorf("node %s's agent wrote %d times (%d chain, %d CacheReplica updates) during the %.1f s outage, for %d volume ends: over %d, a write storm",
			l.node.Name, fig.Outage.writes(), fig.Outage.ChainWrites, fig.Outage.ReplicaWrites, fig.Outage.Seconds, fig.Outage.Ends, bound)
	}
	l.countRegistryFailed(ctx, fig)
}

// window counts the writes seen in [from, to). Called with mu held.
func (r *registryRun) window(from, to time.Time) activity {
	in := func(ts []time.Time) int {
		n := 0
		for _, t := range ts {
			if !t.Before(from) && t.Before(to) {
				n++
			}
		}
		return n
	}
	return activity{Seconds: to.Sub(from).Seconds(), ChainWrites: in(r.chainWrites), ReplicaWrites: in(r.replicaWrites)}
}

// countRegistryFailed counts the namespace's RegistryFailed Events, their
// repeats included, and fails the test if the outage made more than
// registryFailedPerCache per cache.
func (l *load) countRegistryFailed(ctx context.Context, fig *registryFigures) {
	evs, err := l.f.Client.CoreV1().Events(l.f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		l.t.Errorf("listing the Events: %v", err)
		return
	}
	for _, ev := range evs.Items {
		if ev.Reason != "RegistryFailed" || ev.Type != corev1.EventTypeWarning {
			continue
		}
		fig.RegistryFailed += int(max(ev.Count, 1))
		if ev.Series != nil {
			fig.RegistryFailed += int(ev.Series.Count)
		}
		if !slices.Contains(fig.RegistryFailedNotes, ev.Message) {
			fig.RegistryFailedNotes = append(fig.RegistryFailedNotes, ev.Message)
		}
	}
	if bound := registryFailedPerCache * len(l.caches); fig.RegistryFailed > bound {
		l.t.Errorf("%d RegistryFailed Events for one outage of %d caches, over %d: an Event flood; messages: %q", fig.RegistryFailed, len(l.caches), bound, fig.RegistryFailedNotes)
	}
}

// expectQuiet waits up to quietSettle for layercache's state in the
// namespace to settle, then fails the test if it changes within
// QuietWatch. Not framework.ExpectQuiet: it counts every Event, and
// kube-scheduler writes the final count of an Event series (FailedScheduling
// of the load's pods) 6 minutes after its last repeat (client-go's events
// broadcaster), into any window that follows a long load.
func (l *load) expectQuiet(ctx context.Context) {
	var before string
	err := wait.PollUntilContextTimeout(ctx, 15*time.Second, quietSettle, false, func(ctx context.Context) (bool, error) {
		now, err := l.layercacheState(ctx)
		settled := err == nil && now == before
		before = now
		return settled, nil
	})
	if err != nil {
		l.t.Errorf("layercache's objects in namespace %s did not settle within %s: %v; last: %s", l.f.Namespace, quietSettle, err, before)
		return
	}
	l.t.Logf("watching layercache's objects in namespace %s for %s: %s", l.f.Namespace, l.cfg.QuietWatch, before)
	time.Sleep(l.cfg.QuietWatch)
	now, err := l.layercacheState(ctx)
	if err != nil {
		l.t.Errorf("reading layercache's objects after %s of quiet: %v", l.cfg.QuietWatch, err)
	} else if now != before {
		l.t.Errorf("layercache wrote to namespace %s within %s after the load:\nbefore %s\nnow    %s", l.f.Namespace, l.cfg.QuietWatch, before, now)
	}
}

// layercacheState summarises what any write of layercache's to the
// namespace would change: its Caches' and CacheReplicas' resourceVersions
// and the count of the Events its node agents and manager made.
func (l *load) layercacheState(ctx context.Context) (string, error) {
	var caches v1alpha1.CacheList
	if err := l.reg.client.List(ctx, &caches, client.InNamespace(l.f.Namespace)); err != nil {
		return "", err
	}
	var replicas v1alpha1.CacheReplicaList
	if err := l.reg.client.List(ctx, &replicas, client.InNamespace(l.f.Namespace)); err != nil {
		return "", err
	}
	evs, err := l.f.Client.CoreV1().Events(l.f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for _, c := range caches.Items {
		fmt.Fprintf(&out, "Cache %s rv %s; ", c.Name, c.ResourceVersion)
	}
	for _, r := range replicas.Items {
		fmt.Fprintf(&out, "CacheReplica %s rv %s; ", r.Name, r.ResourceVersion)
	}
	n := 0
	for _, ev := range evs.Items {
		if !strings.HasPrefix(ev.ReportingController, "layercache") && !strings.HasPrefix(ev.Source.Component, "layercache") {
			continue
		}
		n += int(max(ev.Count, 1))
		if ev.Series != nil {
			n += int(ev.Series.Count)
		}
	}
	fmt.Fprintf(&out, "%d Events from layercache", n)
	return out.String(), nil
}
