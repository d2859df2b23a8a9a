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
)

type reportInput struct {
	loadTime, totalTime time.Duration
	agent               agentProc
	agentErr            error
	cpuBefore, cpuAfter float64
	cpuErr              error
	rssEnd              int64
	rssErr              error
	writes              map[string]map[string]float64
	writesErr           error
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
	Config    config  `json:"config"`
	Node      string  `json:"node"`
	Namespace string  `json:"namespace"`
	Completed int     `json:"completedBuilds"`
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
	Kept      int     `json:"kept"`
	Passed    bool    `json:"passed"`
	LoadSec   float64 `json:"loadSeconds"`
	TotalSec  float64 `json:"totalSeconds"`

	// Start: pod created (the test's clock before the create call) →
	// the container's first instruction (/proc/uptime), by volume kind.
	Start map[string]latency `json:"createdToStarted"`
	// Commit: the build's last instruction → the node agent's end Event
	// (eventTime, microseconds), by end reason and volume kind.
	End map[string]latency `json:"endedToVolumeEnded"`

	Agent struct {
		PID             int     `json:"pid,omitempty"`
		MaxLayers       int     `json:"maxLayers,omitempty"`
		PeakRSSBytes    int64   `json:"peakRSSBytes"`
		EndRSSBytes     int64   `json:"endRSSBytes"`
		RSSSamples      int     `json:"rssSamples"`
		CPUSeconds      float64 `json:"cpuSeconds"`
		CPUPerBuild     float64 `json:"cpuSecondsPerBuild"`
		Unavailable     string  `json:"unavailable,omitempty"`
		PeakLayers      int     `json:"peakLayers"`
		PeakLayersCache string  `json:"peakLayersCache,omitempty"`
	} `json:"nodeAgent"`

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

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// writeReport computes the figures, writes report.md and report.json to
// cfg.Output and logs the Markdown.
func (l *load) writeReport(ctx context.Context, in reportInput) *report {
	r := &report{Config: l.cfg, Node: l.node.Name, Namespace: l.f.Namespace, Builds: l.builds,
		LoadSec: in.loadTime.Seconds(), TotalSec: in.totalTime.Seconds(), Passed: !l.t.Failed(), EndLayers: l.endLayers}
	starts := map[string][]time.Duration{}
	ends := map[string][]time.Duration{}
	for _, b := range l.builds {
		if b.SeenEnd.IsZero() {
			continue
		}
		r.Completed++
		if b.ExpectFail {
			r.Failed++
		} else {
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

	a := &r.Agent
	l.samples.mu.Lock()
	a.PeakRSSBytes, a.RSSSamples = l.samples.PeakRSS, l.samples.Samples
	a.PeakLayers, a.PeakLayersCache = l.samples.PeakLayers, l.samples.PeakCache
	rssErr := l.samples.RSSError
	l.samples.mu.Unlock()
	if in.agentErr == nil {
		a.PID, a.MaxLayers = in.agent.PID, in.agent.MaxLays
	}
	switch {
	case in.agentErr != nil:
		a.Unavailable = in.agentErr.Error()
	case rssErr != "":
		a.Unavailable = rssErr
	case in.rssErr != nil || in.cpuErr != nil:
		a.Unavailable = fmt.Sprintf("at the end: %v %v", in.rssErr, in.cpuErr)
	default:
		a.EndRSSBytes = in.rssEnd
		a.PeakRSSBytes = max(a.PeakRSSBytes, in.rssEnd)
		a.CPUSeconds = in.cpuAfter - in.cpuBefore
		if r.Completed > 0 {
			a.CPUPerBuild = a.CPUSeconds / float64(r.Completed)
		}
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
	for name, b := range map[string][]byte{"report.md": []byte(md), "report.json": append(j, '\n')} {
		if err := os.WriteFile(filepath.Join(l.cfg.Output, name), b, 0o644); err != nil {
			l.t.Errorf("report: %v", err)
		}
	}
	l.t.Logf("report written to %s", l.cfg.Output)
	return r
}

func (r *report) markdown() string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	c := r.Config
	verdict := "passed"
	if !r.Passed {
		verdict = "**FAILED** (figures below are partial)"
	}
	w("# Load on one node (`TestLoad`)")
	w("")
	w("%s, %s. %d concurrent, then %d churn builds at most %d at once, over %d caches; %d%% decided to fail; volumes: %s; %d-byte file per build; every %d-th pod kept, the others deleted at their end; seed %d; node %s, namespace %s.",
		time.Now().UTC().Format(time.RFC3339), verdict, c.Concurrent, c.Builds, c.Concurrent, c.Caches, c.FailPercent, c.Volume, c.FileBytes, c.KeepEvery, c.Seed, r.Node, r.Namespace)
	w("")
	w("Completed builds: %d (%d succeeded, %d failed, %d kept). Load phases: %.1f s; with checks and clean-up: %.1f s.", r.Completed, r.Succeeded, r.Failed, r.Kept, r.LoadSec, r.TotalSec)
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
	lat("build end → Committed, claim", r.End, "Committed claim", "")
	lat("build end → Committed, CSI", r.End, "Committed csi", "")
	lat("build end → Discarded, all", r.End, "Discarded", "")
	a := r.Agent
	if a.Unavailable != "" {
		w("| node agent RSS, CPU | unavailable: %s | ≤ 256 MiB at 50 concurrent volumes |", a.Unavailable)
	} else {
		w("| node agent RSS | peak %s, at end %s (%d samples, every 0.5 s) | ≤ 256 MiB at 50 concurrent volumes (this run: %d); asserted < 1 GiB |", mib(a.PeakRSSBytes), mib(a.EndRSSBytes), a.RSSSamples, c.Concurrent)
		w("| node agent CPU | %.1f s in all, %.3f s per build | |", a.CPUSeconds, a.CPUPerBuild)
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
	w("How: start is the test's clock before the create call to the container's first `/proc/uptime` (10 ms resolution; containers share the host's boot clock). End is the build's last `/proc/uptime`, just before it exits, to the eventTime (microseconds) of the node agent's Committed or Discarded Event. API writes are the POST, PUT, PATCH and DELETE of `rest_client_requests_total` of the node's agent and all manager replicas, read through the pod proxy before phase 1 and after clean-up: on a shared cluster they include other tests' builds and the manager's lease renewals, so they are an upper bound. Node agent RSS is VmRSS and CPU utime+stime of its process, read from the host's /proc; they include whatever else the agent served meanwhile. Disk use is `du` of the caches' layers (allocated blocks) against the bytes the succeeded builds wrote; the whole store is shared with other tests.")
	if r.StoreDiskError != "" {
		w("")
		w("Disk use errors: %s", r.StoreDiskError)
	}
	return s.String()
}
