//go:build e2e

package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/e2e/bench"
)

type reportInput struct {
	loadTime, totalTime time.Duration
	agent               agentProc
	agentErr            error
	writes              map[string]map[string]float64
	writesErr           error
	endDelay            bench.Histogram
	endDelayErr         error
}

// latency is p50, p99 and max of a set of durations, in seconds.
type latency struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// newLatency: nearest-rank percentiles.
func newLatency(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(i, 0)].Seconds()
	}
	return latency{N: len(s), P50: rank(0.50), P99: rank(0.99), Max: s[len(s)-1].Seconds()}
}

type report struct {
	Config    config `json:"config"`
	Node      string `json:"node"`
	Namespace string `json:"namespace"`
	Completed int    `json:"completedBuilds"`
	Succeeded int    `json:"succeeded"`
	Failed    int    `json:"failed"`
	// Interrupted builds were killed by node-reboot (and discarded),
	// whatever they had decided.
	Interrupted int `json:"interrupted,omitempty"`
	// QuietWrites are the API writes by component and method in the
	// quiet window after a fault run's end.
	QuietWrites map[string]map[string]float64 `json:"quietWrites,omitempty"`
	Kept        int                           `json:"kept"`
	Passed      bool                          `json:"passed"`
	LoadSec     float64                       `json:"loadSeconds"`
	TotalSec    float64                       `json:"totalSeconds"`

	// Start: pod created (the test's clock before the create call) →
	// the container's first instruction (/proc/uptime), by volume kind.
	Start map[string]latency `json:"createdToStarted"`
	// Commit: the build's last instruction → the node agent's end Event
	// (eventTime, microseconds), by end reason and volume kind.
	End map[string]latency `json:"endedToVolumeEnded"`
	// AgentEndDelay: the node agent's pod watch seeing a build's pod end →
	// the volume's end, from its histogram (endDelayMetric): the agent's
	// share of End.
	AgentEndDelay            *histLatency `json:"agentEndDelay,omitempty"`
	AgentEndDelayUnavailable string       `json:"agentEndDelayUnavailable,omitempty"`

	Agent struct {
		PID          int   `json:"pid,omitempty"` // at the start
		MaxLayers    int   `json:"maxLayers,omitempty"`
		PeakRSSBytes int64 `json:"peakRSSBytes"` // of any of its processes
		EndRSSBytes  int64 `json:"endRSSBytes"`  // of the last process, at its last sample
		RSSSamples   int   `json:"rssSamples"`
		// Gaps are samples that found no agent process (it was killed
		// and not yet back).
		Gaps int `json:"gaps"`
		// CPUSeconds is summed over its processes (procSample).
		CPUSeconds      float64      `json:"cpuSeconds"`
		CPUPerBuild     float64      `json:"cpuSecondsPerBuild"`
		Processes       []procSample `json:"processes"`
		Unavailable     string       `json:"unavailable,omitempty"`
		PeakLayers      int          `json:"peakLayers"`
		PeakLayersCache string       `json:"peakLayersCache,omitempty"`
	} `json:"nodeAgent"`

	Fault *faultRun `json:"fault,omitempty"`
	// Lost and Extra are the files a cache lacked or held beyond its
	// succeeded builds', as "cache/build (volume kind)".
	Lost  []string `json:"lost"`
	Extra []string `json:"extra"`

	Writes            map[string]map[string]float64 `json:"writes,omitempty"`
	WritesPerBuild    map[string]float64            `json:"writesPerBuild,omitempty"`
	WritesUnavailable string                        `json:"writesUnavailable,omitempty"`

	Events         int            `json:"events"`
	EventsByReason map[string]int `json:"eventsByReason"`
	EventsPerBuild float64        `json:"eventsPerBuild"`

	LogicalBytes   int64  `json:"logicalBytes"`
	LayersDiskUse  int64  `json:"cachesDiskBytes"`
	StoreDiskUse   int64  `json:"storeDiskBytes"`
	StoreDiskError string `json:"storeDiskError,omitempty"`

	EndLayers map[string]int `json:"endLayers"`

	Builds []*build `json:"builds"`
}

// histLatency is p50 and p99 estimated from a histogram's buckets, in
// seconds.
type histLatency struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// writeReport computes the figures, writes report.md and report.json to
// cfg.Output and logs the Markdown.
func (l *load) writeReport(ctx context.Context, in reportInput) *report {
	r := &report{Config: l.cfg, Node: l.node.Name, Namespace: l.f.Namespace, Builds: l.builds,
		LoadSec: in.loadTime.Seconds(), TotalSec: in.totalTime.Seconds(), Passed: !l.t.Failed(), EndLayers: l.endLayers,
		QuietWrites: l.quietWrites}
	starts := map[string][]time.Duration{}
	ends := map[string][]time.Duration{}
	for _, b := range l.builds {
		if b.SeenEnd.IsZero() {
			continue
		}
		r.Completed++
		switch {
		case b.Interrupted:
			r.Interrupted++
		case b.ExpectFail:
			r.Failed++
		default:
			r.Succeeded++
			r.LogicalBytes += int64(l.cfg.FileBytes)
		}
		if b.Kept {
			r.Kept++
		}
		if !b.Started.IsZero() {
			d := b.Started.Sub(b.Created)
			starts["all"] = append(starts["all"], d)
			starts[b.Volume] = append(starts[b.Volume], d)
		}
		if !b.Ended.IsZero() && !b.VolumeEnded.IsZero() {
			d := b.VolumeEnded.Sub(b.Ended)
			ends[b.EndReason] = append(ends[b.EndReason], d)
			ends[b.EndReason+" "+b.Volume] = append(ends[b.EndReason+" "+b.Volume], d)
			if b.Phase == 1 {
				ends[b.EndReason+" phase 1"] = append(ends[b.EndReason+" phase 1"], d)
			}
		}
	}
	r.Start, r.End = map[string]latency{}, map[string]latency{}
	for k, v := range starts {
		r.Start[k] = newLatency(v)
	}
	for k, v := range ends {
		r.End[k] = newLatency(v)
	}

	if in.endDelayErr != nil {
		r.AgentEndDelayUnavailable = in.endDelayErr.Error()
	} else if n := in.endDelay.Count(); n > 0 {
		r.AgentEndDelay = &histLatency{N: int(n), P50: in.endDelay.Quantile(0.5), P99: in.endDelay.Quantile(0.99)}
	}

	a := &r.Agent
	a.PeakRSSBytes, a.CPUSeconds, a.Processes = l.samples.totals()
	l.samples.mu.Lock()
	a.RSSSamples, a.Gaps = l.samples.Samples, l.samples.Gaps
	a.PeakLayers, a.PeakLayersCache = l.samples.PeakLayers, l.samples.PeakCache
	l.samples.mu.Unlock()
	if in.agentErr == nil {
		a.PID, a.MaxLayers = in.agent.PID, in.agent.MaxLays
	}
	switch {
	case in.agentErr != nil:
		a.Unavailable = in.agentErr.Error()
	case a.RSSSamples == 0:
		a.Unavailable = "no sample of the agent's process"
	default:
		if n := len(a.Processes); n > 0 {
			a.EndRSSBytes = a.Processes[n-1].LastRSS
		}
		if r.Completed > 0 {
			a.CPUPerBuild = a.CPUSeconds / float64(r.Completed)
		}
	}
	if l.fault != nil {
		l.mu.Lock()
		f := *l.fault
		f.Events = slices.Clone(f.Events)
		l.mu.Unlock()
		r.Fault = &f
	}
	away := awayWindows(r.Fault, a.Processes)
	for _, x := range l.lost {
		r.Lost = append(r.Lost, l.describeFile(x, away))
	}
	for _, x := range l.extra {
		r.Extra = append(r.Extra, l.describeFile(x, away))
	}

	if in.writesErr != nil {
		r.WritesUnavailable = in.writesErr.Error()
	} else if in.writes != nil {
		r.Writes = in.writes
		r.WritesPerBuild = map[string]float64{}
		for comp, byMethod := range in.writes {
			var sum float64
			for _, v := range byMethod {
				sum += v
			}
			if r.Completed > 0 {
				r.WritesPerBuild[comp] = sum / float64(r.Completed)
			}
		}
	}

	r.EventsByReason = map[string]int{}
	if evs, err := l.f.Client.CoreV1().Events(l.f.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, ev := range evs.Items {
			n := int(max(ev.Count, 1))
			if ev.Series != nil {
				n += int(ev.Series.Count)
			}
			r.Events += n
			r.EventsByReason[ev.Reason] += n
		}
		if r.Completed > 0 {
			r.EventsPerBuild = float64(r.Events) / float64(r.Completed)
		}
	} else {
		l.t.Logf("report: listing Events: %v", err)
	}

	var layerDirs []string
	for _, c := range l.caches {
		h, err := readHead(ctx, l.f.Cluster, l.node, l.f.Namespace, c)
		if err != nil {
			continue
		}
		for _, lay := range h.Layers {
			layerDirs = append(layerDirs, storeRoot+"/layers/"+lay.ID)
		}
	}
	var errs []string
	if len(layerDirs) > 0 {
		n, err := duBytes(ctx, l.f.Cluster, l.node, layerDirs...)
		if err != nil {
			errs = append(errs, err.Error())
		}
		r.LayersDiskUse = n
	}
	n, err := duBytes(ctx, l.f.Cluster, l.node, storeRoot)
	if err != nil {
		errs = append(errs, err.Error())
	}
	r.StoreDiskUse = n
	r.StoreDiskError = strings.Join(errs, "; ")

	md := r.markdown()
	l.t.Log("\n" + md)
	if err := os.MkdirAll(l.cfg.Output, 0o755); err != nil {
		l.t.Errorf("report: %v", err)
		return r
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		l.t.Errorf("report: %v", err)
		return r
	}
	base := reportName(l.cfg.Fault)
	for name, b := range map[string][]byte{base + ".md": []byte(md), base + ".json": append(j, '\n')} {
		if err := os.WriteFile(filepath.Join(l.cfg.Output, name), b, 0o644); err != nil {
			l.t.Errorf("report: %v", err)
		}
	}
	l.t.Logf("report written to %s", l.cfg.Output)
	return r
}

// reportName is the base name of a run's report files: report for the
// plain load, report-FAULT under a fault, so that make soak's runs keep
// a report each.
func reportName(fault string) string {
	if fault == faultNone || fault == "" {
		return "report"
	}
	return "report-" + fault
}

// window is a time when the agent, or the API server, was away.
type window struct {
	from, to time.Time
	what     string
}

// awayWindows are the fault's outages and the gaps between the agent's
// processes (a kill, a crash, or a redeploy that was no part of the
// test), so that a lost build can be told apart by when it ended.
func awayWindows(f *faultRun, procs []procSample) []window {
	var out []window
	if f != nil {
		for _, ev := range f.Events {
			what := "agent killed"
			switch f.Kind {
			case faultAPIServer:
				what = "API server away"
			case faultNodeRestart:
				what = "kubelet and containerd away"
			case faultNodeReboot:
				what = "node rebooting"
			case faultManagerLeader:
				what = "no manager leader"
			case faultRegistry:
				what = "registry away"
			}
			out = append(out, window{ev.At, ev.At.Add(ev.Back), what})
		}
	}
	for i := 1; i < len(procs); i++ {
		out = append(out, window{procs[i-1].LastSeen, procs[i].FirstSeen, fmt.Sprintf("agent pid %d gone, pid %d not yet", procs[i-1].PID, procs[i].PID)})
	}
	return out
}

// describeFile names a cache's file "cache/build" with its build's volume
// kind, outcome, end, and the window it fell in, if any. What counts is
// when the test saw the pod terminal (its status reached the API server;
// under load seconds after the container's exit) and deleted it: a pod
// that ends and goes while the agent is away, or cannot watch, is the
// case the fault exercises.
func (l *load) describeFile(cacheFile string, away []window) string {
	_, name, _ := strings.Cut(cacheFile, "/")
	b := l.byName[name]
	if b == nil {
		return cacheFile + " (no build of the test)"
	}
	s := fmt.Sprintf("%s (%s, pod ended %s at %s, seen terminal and deleted at %s, volume %s", cacheFile, b.Volume,
		map[bool]string{true: "failed", false: "succeeded"}[b.ExpectFail], b.Ended.UTC().Format("15:04:05.00"),
		b.SeenEnd.UTC().Format("15:04:05.00"), b.EndReason)
	for _, w := range away {
		if !b.SeenEnd.Before(w.from) && b.SeenEnd.Before(w.to.Add(2*time.Second)) {
			s += fmt.Sprintf("; during %s %s–%s", w.what, w.from.UTC().Format("15:04:05.0"), w.to.UTC().Format("15:04:05.0"))
		}
	}
	return s + ")"
}

func (r *report) markdown() string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	c := r.Config
	verdict := "passed"
	if !r.Passed {
		verdict = "**FAILED** (figures below are partial)"
	}
	fault := "none"
	if r.Fault != nil {
		fault = r.Fault.Kind
	}
	w("# Load on one node (`TestLoad`), fault: %s", fault)
	w("")
	w("%s, %s. %d concurrent, then %d churn builds at most %d at once, over %d caches; %d%% decided to fail; volumes: %s; %d-byte file per build; every %d-th pod kept, the others deleted at their end; seed %d; node %s, namespace %s.",
		time.Now().UTC().Format(time.RFC3339), verdict, c.Concurrent, c.Builds, c.Concurrent, c.Caches, c.FailPercent, c.Volume, c.FileBytes, c.KeepEvery, c.Seed, r.Node, r.Namespace)
	w("")
	w("Completed builds: %d (%d succeeded, %d failed, %d killed by the fault, %d kept). Load phases: %.1f s; with checks and clean-up: %.1f s.", r.Completed, r.Succeeded, r.Failed, r.Interrupted, r.Kept, r.LoadSec, r.TotalSec)
	w("")
	w("| figure | measured | target (issue) |")
	w("| --- | --- | --- |")
	lat := func(name string, m map[string]latency, key, target string) {
		v, ok := m[key]
		if !ok {
			return
		}
		w("| %s | p50 %.2f s, p99 %.2f s, max %.2f s (n=%d) | %s |", name, v.P50, v.P99, v.Max, v.N, target)
	}
	lat("pod created → container started, all", r.Start, "all", "")
	lat("pod created → container started, claim", r.Start, "claim", "")
	lat("pod created → container started, CSI", r.Start, "csi", "")
	lat("build end → Committed, all", r.End, "Committed", fmt.Sprintf("p99 ≤ 2 s under the 50-pod load (this run: %d)", c.Concurrent))
	lat("build end → Committed, phase 1 (all at once)", r.End, "Committed phase 1", "")
	if d := r.AgentEndDelay; d != nil {
		w("| of which the node agent's: its pod watch seeing the pod end → the volume's end (`%s`) | p50 %.2f s, p99 %.2f s (n=%d, from its buckets) | |", endDelayMetric, d.P50, d.P99, d.N)
	} else if r.AgentEndDelayUnavailable != "" {
		w("| of which the node agent's (`%s`) | unavailable: %s | |", endDelayMetric, r.AgentEndDelayUnavailable)
	}
	lat("build end → Committed, claim", r.End, "Committed claim", "")
	lat("build end → Committed, CSI", r.End, "Committed csi", "")
	lat("build end → Discarded, all", r.End, "Discarded", "")
	a := r.Agent
	if a.Unavailable != "" {
		w("| node agent RSS, CPU | unavailable: %s | ≤ 256 MiB at 50 concurrent volumes |", a.Unavailable)
	} else {
		w("| node agent RSS | peak %s, at end %s (%d samples, every 0.5 s; %d process(es), %d samples found none) | ≤ 256 MiB at 50 concurrent volumes (this run: %d); asserted < 1 GiB |", mib(a.PeakRSSBytes), mib(a.EndRSSBytes), a.RSSSamples, len(a.Processes), a.Gaps, c.Concurrent)
		w("| node agent CPU | %.1f s in all (summed over its processes), %.3f s per build | |", a.CPUSeconds, a.CPUPerBuild)
	}
	var depths []string
	for _, k := range slices.Sorted(maps.Keys(r.EndLayers)) {
		depths = append(depths, fmt.Sprintf("%s %d", k, r.EndLayers[k]))
	}
	w("| cache depth | at most %d layers seen during the load (cache %s, sampled every second); after it: %s; --max-layers %d | ≤ --max-layers + small slack (asserted: after the load ≤ --max-layers; during it ≤ --max-layers + max(%d, concurrent builds)) |",
		a.PeakLayers, a.PeakLayersCache, strings.Join(depths, ", "), a.MaxLayers, layerSlack)
	if r.WritesUnavailable != "" {
		w("| API writes per build | unavailable: %s | flat from 10 to 500 builds |", r.WritesUnavailable)
	} else {
		for _, comp := range slices.Sorted(maps.Keys(r.WritesPerBuild)) {
			m := r.Writes[comp]
			w("| API writes per build, %s | %.2f (POST %g, PUT %g, PATCH %g, DELETE %g in all) | flat from 10 to 500 builds |",
				comp, r.WritesPerBuild[comp], m["POST"], m["PUT"], m["PATCH"], m["DELETE"])
		}
	}
	w("| Events per build (test namespace, all components, the check pods included) | %.2f (%d in all) | |", r.EventsPerBuild, r.Events)
	w("| store disk use | caches' layers %s for %s written by succeeded builds (%.2fx); whole store %s | |",
		mib(r.LayersDiskUse), mib(r.LogicalBytes), float64(r.LayersDiskUse)/math.Max(float64(r.LogicalBytes), 1), mib(r.StoreDiskUse))
	w("")
	var reasons []string
	for _, k := range slices.Sorted(maps.Keys(r.EventsByReason)) {
		reasons = append(reasons, fmt.Sprintf("%s %d", k, r.EventsByReason[k]))
	}
	w("Events by reason: %s.", strings.Join(reasons, ", "))
	w("")
	w("Cache contents against the succeeded builds: %d lost, %d extra.", len(r.Lost), len(r.Extra))
	for _, x := range r.Lost {
		w("- lost: %s", x)
	}
	for _, x := range r.Extra {
		w("- extra: %s", x)
	}
	w("")
	r.faultMarkdown(w)
	r.processMarkdown(w)
	w("How: start is the test's clock before the create call to the container's first `/proc/uptime` (10 ms resolution; containers share the host's boot clock). End is the build's last `/proc/uptime`, just before it exits, to the eventTime (microseconds) of the node agent's Committed or Discarded Event. The node agent's share of it is its histogram `layercache_volume_end_delay_seconds` (buckets 1.46 times apart), read before phase 1 and after clean-up, so it covers whatever else the agent ended meanwhile and is unavailable when the agent restarted in between: from the moment its pod watch saw a pod end to the volume's end; the rest is the kubelet seeing the container exit and reporting it, and the API server's watch delivering that. API writes are the POST, PUT, PATCH and DELETE of `rest_client_requests_total` of the node's agent and all manager replicas, read through the pod proxy before phase 1 and after clean-up: on a shared cluster they include other tests' builds and the manager's lease renewals, so they are an upper bound. Node agent RSS is VmRSS and CPU utime+stime of its process, read from the host's /proc every 0.5 s, per process: a restarted agent is a new process, found again by its command line; the peak RSS is the highest of any process, the CPU the sum over them (a killed process's CPU up to its last sample; a process started during the load counts whole). They include whatever else the agent served meanwhile. Disk use is `du` of the caches' layers (allocated blocks) against the bytes the succeeded builds wrote; the whole store is shared with other tests.")
	if r.StoreDiskError != "" {
		w("")
		w("Disk use errors: %s", r.StoreDiskError)
	}
	return s.String()
}

// faultMarkdown writes the fault's injections.
func (r *report) faultMarkdown(w func(string, ...any)) {
	f := r.Fault
	if f == nil || f.Kind == faultNone {
		return
	}
	c := r.Config
	switch f.Kind {
	case faultAgentKill:
		w("## Fault: agent-kill")
		w("")
		w("The node agent's process SIGKILLed %d time(s) of %d asked, each %s after phase 2's start or the agent's return; the kubelet restarts it after its CrashLoopBackOff delay.", len(f.Events), c.FaultKills, c.FaultEvery)
		w("")
		w("| # | killed at (UTC) | during phase 2 | pid | new pid | new process after | pod Ready after | error |")
		w("| --- | --- | --- | --- | --- | --- | --- | --- |")
		for i, ev := range f.Events {
			w("| %d | %s | %v | %d | %d | %.1f s | %.1f s | %s |", i+1, ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.OldPID, ev.NewPID, ev.Back.Seconds(), ev.Ready.Seconds(), ev.Error)
		}
	case faultAgentOOM:
		w("## Fault: agent-oom")
		w("")
		w("The node agent's memory cgroup limit lowered to its usage %d time(s) of %d asked, each %s after phase 2's start or the agent's return, until the kernel's OOM killer killed it; the limit restored; the kubelet restarts it after its CrashLoopBackOff delay.", len(f.Events), c.FaultKills, c.FaultEvery)
		w("")
		w("| # | killed at (UTC) | during phase 2 | pid | limit | kubelet's reason | new pid | new process after | pod Ready after | error |")
		w("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for i, ev := range f.Events {
			w("| %d | %s | %v | %d | %s | %s | %d | %.1f s | %.1f s | %s |", i+1, ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.OldPID, mib(ev.OOMLimit), ev.Killed, ev.NewPID, ev.Back.Seconds(), ev.Ready.Seconds(), ev.Error)
		}
	case faultAPIServer:
		w("## Fault: apiserver")
		w("")
		w("etcd and kube-apiserver stopped (TERM) %s after phase 2's start, kept down %s, started again with their recorded command lines (`e2e/cluster/control-plane.sh`).", c.FaultEvery, c.FaultDown)
		w("")
		w("| stopped at (UTC) | during phase 2 | stopping took | /readyz again after | error |")
		w("| --- | --- | --- | --- | --- |")
		for _, ev := range f.Events {
			w("| %s | %v | %.1f s | %.1f s | %s |", ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.Stopping.Seconds(), ev.Back.Seconds(), ev.Error)
		}
	case faultManagerLeader:
		w("## Fault: manager-leader")
		w("")
		w("The manager ran as two replicas (a standby copy of its Deployment beside it); its leader (the holder of its Lease) SIGKILLed %s after phase 2's start. Every %d-th build of phase 2 used a standalone claim with `layercache.dev/release: on-pod-exit`, which only the manager releases.", c.FaultEvery, standaloneEvery)
		w("")
		w("| killed at (UTC) | during phase 2 | killed leader | pid | new leader | new leader after | error |")
		w("| --- | --- | --- | --- | --- | --- | --- |")
		for _, ev := range f.Events {
			w("| %s | %v | %s | %d | %s | %.1f s | %s |", ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.Killed, ev.OldPID, ev.NewLeader, ev.Back.Seconds(), ev.Error)
		}
	case faultNodeReboot:
		w("## Fault: node-reboot")
		w("")
		w("The node rebooted %s after phase 2's start (`e2e/cluster/node-daemons.sh reboot`): its agent, kubelet, containerd, shims and containers SIGKILLed, every mount of the node gone (the store's overlays unmounted on the host), containerd's and runc's state removed as a tmpfs would lose them, the store's files kept; then node.sh in a new mount namespace. The kernel did not reboot (same boot id: no torn volumes). %d build(s) were killed by it.", c.FaultEvery, r.Interrupted)
		w("")
		w("| rebooted at (UTC) | during phase 2 | kubelet healthy after | Node Ready after | agent pid | new pid | agent Ready after | error |")
		w("| --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, ev := range f.Events {
			w("| %s | %v | %.1f s | %.1f s | %d | %d | %.1f s | %s |", ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.Back.Seconds(), ev.Ready.Seconds(), ev.OldPID, ev.NewPID, ev.AgentReady.Seconds(), ev.Error)
		}
	case faultNodeRestart:
		w("## Fault: node-restart")
		w("")
		w("The node's kubelet and containerd stopped (TERM) %s after phase 2's start and started again at once with their recorded command lines in the node's mount namespace (`e2e/cluster/node-daemons.sh`); the containers ran on under their shims.", c.FaultEvery)
		w("")
		w("| stopped at (UTC) | during phase 2 | stopping took | kubelet healthy after | Node Ready after | error |")
		w("| --- | --- | --- | --- | --- | --- |")
		for _, ev := range f.Events {
			w("| %s | %v | %.1f s | %.1f s | %.1f s | %s |", ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.Stopping.Seconds(), ev.Back.Seconds(), ev.Ready.Seconds(), ev.Error)
		}
	case faultRegistry:
		registryMarkdown(w, f, c)
	}
	if f.Note != "" {
		w("")
		w("Note: %s.", f.Note)
	}
	if r.QuietWrites != nil {
		w("")
		w("API writes in the %s after the test's end (no Event or write storm left): %v.", quietWindow, r.QuietWrites)
	}
	w("")
}

// registryMarkdown writes the registry fault's outage and figures.
func registryMarkdown(w func(string, ...any), f *faultRun, c config) {
	w("## Fault: registry")
	w("")
	w("The registry (`e2e/cluster/registry.sh`) stopped %s after phase 2's start, kept down %s and started again with its blobs; the builds ran on node 1 with claims of the registry's StorageClass.", c.FaultEvery, c.FaultDown)
	w("")
	w("| stopped at (UTC) | during phase 2 | stopping took | answering again after | node 1's backlog then | all of it published after | error |")
	w("| --- | --- | --- | --- | --- | --- | --- |")
	for _, ev := range f.Events {
		w("| %s | %v | %.1f s | %.1f s | %d generation(s) | %.1f s | %s |", ev.At.UTC().Format("15:04:05.000"), ev.DuringLoad, ev.Stopping.Seconds(), ev.Back.Seconds(), ev.Backlog, ev.Published.Seconds(), ev.Error)
	}
	r := f.Registry
	if r == nil {
		return
	}
	w("")
	w("| window | seconds | volume ends | commits | node 1's agent: chain writes | CacheReplica writes | writes per volume end |")
	w("| --- | --- | --- | --- | --- | --- | --- |")
	for _, row := range []struct {
		name string
		a    activity
	}{{"registry away", r.Outage}, {"the rest, to the publish check", r.Rest}} {
		w("| %s | %.1f | %d | %d | %d | %d | %.2f |", row.name, row.a.Seconds, row.a.Ends, row.a.Commits, row.a.ChainWrites, row.a.ReplicaWrites, float64(row.a.writes())/math.Max(float64(row.a.Ends), 1))
	}
	w("")
	var gens []string
	for _, k := range slices.Sorted(maps.Keys(r.Generations)) {
		gens = append(gens, fmt.Sprintf("%s %d", k, r.Generations[k]))
	}
	w("Published at node 1's generation, nothing unpublished, no publishError: %s. RegistryFailed Events: %d (bound %d per cache), %d distinct. Node %s read the caches after the load: %d lost, %d extra.",
		strings.Join(gens, ", "), r.RegistryFailed, registryFailedPerCache, len(r.RegistryFailedNotes), r.OtherNode, len(r.OtherLost), len(r.OtherExtra))
	for _, x := range r.OtherLost {
		w("- lost on %s: %s", r.OtherNode, x)
	}
	for _, x := range r.OtherExtra {
		w("- extra on %s: %s", r.OtherNode, x)
	}
	w("")
	w("Writes are the changes the test's watch saw of the Caches' status.published (node 1 is the only writer) and of node 1's CacheReplicas, in this namespace only. After this report layercache's objects in the namespace (Caches, CacheReplicas, its Events) are watched for %s; a write fails the test.", c.QuietWatch)
}

// processMarkdown lists the agent's processes when there were several.
func (r *report) processMarkdown(w func(string, ...any)) {
	ps := r.Agent.Processes
	if len(ps) < 2 {
		return
	}
	w("Node agent processes (more than the fault's kills + 1 means the agent also restarted on its own or was redeployed):")
	w("")
	w("| pid | first seen (UTC) | last seen | peak RSS | CPU during the load | samples |")
	w("| --- | --- | --- | --- | --- | --- |")
	for _, p := range ps {
		w("| %d | %s | %s | %s | %.1f s | %d |", p.PID, p.FirstSeen.UTC().Format("15:04:05.0"), p.LastSeen.UTC().Format("15:04:05.0"), mib(p.PeakRSS), p.CPULast-p.CPUFirst, p.Samples)
	}
	w("")
}
