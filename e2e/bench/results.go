package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Metric is one latency the benchmark reports (see the package
// documentation for the exact definitions).
type Metric string

const (
	MetricStart     Metric = "start"
	MetricCommit    Metric = "commit"
	MetricCopyBack  Metric = "copy-back"
	MetricNext      Metric = "next"
	MetricBuiltNext Metric = "built-next"
)

// Metrics in the order of the table.
var Metrics = []Metric{MetricStart, MetricCommit, MetricCopyBack, MetricNext, MetricBuiltNext}

// MetricTitles name the metrics in the table.
var MetricTitles = map[Metric]string{
	MetricStart:     "claim created → build can start",
	MetricCommit:    "build done → cache committed",
	MetricCopyBack:  "build done → committed, local-path without sync",
	MetricNext:      "pod ended → next pod runs on the new content",
	MetricBuiltNext: "build done → next pod runs on the new content",
}

// MetricDefinitions go into results.json, so that it explains itself.
var MetricDefinitions = map[Metric]string{
	MetricStart: "from the test submitting the build pod (its generic ephemeral volume makes the claim) to the in-pod marker 'ready': " +
		"at container start for layercache, after copying the cache from the store into the new volume (cp -a) for local-path",
	MetricCommit: "from the in-pod marker 'built' to the cache being durably committed: for layercache the test's watch seeing the node's " +
		"CacheReplica of the node at a newer generation (container exit, the kubelet reporting the pod ended, the node agent's commit " +
		"with syncfs and its status report); for local-path the in-pod marker 'committed' after copying the changes back (cp -a -u) and sync -f",
	MetricCopyBack: "local-path: from 'built' to the in-pod marker 'copied', the copy back without sync; layercache: its commit metric",
	MetricNext: "from the test's watch seeing the build pod ended (phase Succeeded, no container running; the test then submits, at once, " +
		"the next pod naming the same cache) to that pod's in-pod marker 'warm', printed once it found the build's output in its cache: " +
		"for layercache at container start, for local-path after copying the cache in from the store (cp -a). A next pod that does not " +
		"find the output prints 'stale' instead and is counted, not timed. local-path's copy back lies before its pod's end, so outside this span",
	MetricBuiltNext: "from the build pod's in-pod marker 'built' to the next pod's 'warm': the span above plus the build pod's end " +
		"(for local-path its copy back and sync)",
}

// Sample is one run: a build pod and the next pod that names its cache.
type Sample struct {
	System System `json:"system"`
	Case   string `json:"case"`
	Run    int    `json:"run"`
	Pod    string `json:"pod"`
	// Submitted is when the test submitted the pod.
	Submitted time.Time `json:"submitted"`
	Markers   Markers   `json:"markers"`
	// PodEnded is when the test saw the build pod ended, and submitted the
	// next pod.
	PodEnded time.Time `json:"podEnded,omitzero"`
	// CommitObserved is when the test saw layercache's commit.
	CommitObserved time.Time `json:"commitObserved,omitzero"`
	NextPod        string    `json:"nextPod,omitempty"`
	NextMarkers    Markers   `json:"nextMarkers,omitempty"`
	// Stale: the next pod did not find the build's output.
	Stale bool `json:"stale,omitempty"`
	// Seconds holds the metrics of this run.
	Seconds map[Metric]float64 `json:"seconds"`
	// Writes are layercache's API writes during the run.
	Writes *WriteWindow `json:"writes,omitempty"`
}

// Observed is what the test recorded of one run.
type Observed struct {
	Submitted      time.Time
	Markers        Markers
	PodEnded       time.Time
	CommitObserved time.Time
	NextMarkers    Markers
}

// NewSample computes a run's metrics from the times the test and the
// scripts recorded.
func NewSample(s System, c Case, run int, o Observed) (Sample, error) {
	sample := Sample{
		System: s, Case: c.Name, Run: run, Pod: PodName(s, c, run),
		Submitted: o.Submitted, Markers: o.Markers, PodEnded: o.PodEnded, CommitObserved: o.CommitObserved,
		NextPod: NextPodName(s, c, run), NextMarkers: o.NextMarkers,
		Seconds: map[Metric]float64{},
	}
	m := o.Markers
	need := []string{MarkStart, MarkReady, MarkBuilt}
	if s == LocalPath {
		need = append(need, MarkCopied, MarkCommitted)
	}
	if err := m.Require(need...); err != nil {
		return sample, fmt.Errorf("pod %s: %w", sample.Pod, err)
	}
	if o.PodEnded.IsZero() {
		return sample, fmt.Errorf("pod %s: its end was not observed", sample.Pod)
	}
	if err := o.NextMarkers.Require(MarkStart, MarkReady); err != nil {
		return sample, fmt.Errorf("pod %s: %w", sample.NextPod, err)
	}
	_, warm := o.NextMarkers[MarkWarm]
	_, stale := o.NextMarkers[MarkStale]
	if warm == stale {
		return sample, fmt.Errorf("pod %s: want exactly one of the markers %s and %s, has %d markers", sample.NextPod, MarkWarm, MarkStale, len(o.NextMarkers))
	}
	sample.Stale = stale
	spans := map[Metric][2]time.Time{MetricStart: {o.Submitted, m[MarkReady]}}
	switch s {
	case Layercache:
		if o.CommitObserved.IsZero() {
			return sample, fmt.Errorf("pod %s: no commit was observed", sample.Pod)
		}
		spans[MetricCommit] = [2]time.Time{m[MarkBuilt], o.CommitObserved}
	case LocalPath:
		spans[MetricCommit] = [2]time.Time{m[MarkBuilt], m[MarkCommitted]}
		spans[MetricCopyBack] = [2]time.Time{m[MarkBuilt], m[MarkCopied]}
	}
	if warm {
		spans[MetricNext] = [2]time.Time{o.PodEnded, o.NextMarkers[MarkWarm]}
		spans[MetricBuiltNext] = [2]time.Time{m[MarkBuilt], o.NextMarkers[MarkWarm]}
	}
	for metric, span := range spans {
		d := span[1].Sub(span[0])
		if d < 0 {
			return sample, fmt.Errorf("pod %s: %s is negative (%s): the test and the node must share a clock (run the benchmark on the machine of the local cluster)", sample.Pod, metric, d)
		}
		sample.Seconds[metric] = d.Seconds()
	}
	return sample, nil
}

// Median returns the median of xs (the mean of the middle two for an even
// count).
func Median(xs []float64) (float64, error) {
	if len(xs) == 0 {
		return 0, errors.New("median of no samples")
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid], nil
	}
	return (s[mid-1] + s[mid]) / 2, nil
}

// Ratio is peer / layercache: above 1 layercache is faster. It is 0 when
// layercache's time is 0, which the table shows as n/a.
func Ratio(peer, layercache float64) float64 {
	if layercache <= 0 {
		return 0
	}
	return peer / layercache
}

// Stat is one system's samples of one metric in one case.
type Stat struct {
	MedianSeconds  float64   `json:"medianSeconds"`
	SamplesSeconds []float64 `json:"samplesSeconds"`
}

func newStat(samples []float64) (Stat, error) {
	m, err := Median(samples)
	return Stat{MedianSeconds: m, SamplesSeconds: samples}, err
}

// Row is one line of the results table.
type Row struct {
	Case       string `json:"case"`
	CaseTitle  string `json:"caseTitle"`
	Metric     Metric `json:"metric"`
	Title      string `json:"title"`
	Layercache Stat   `json:"layercache"`
	LocalPath  Stat   `json:"localPath"`
	// Ratio is LocalPath / Layercache of the medians.
	Ratio float64 `json:"ratio,omitempty"`
	// Stale counts the runs whose next pod did not find the build's
	// output (next-pod metrics only); they have no sample.
	LayercacheStale int `json:"layercacheStale,omitempty"`
	LocalPathStale  int `json:"localPathStale,omitempty"`
}

// rowMetrics pairs the metric of each row: layercache's metric, local-path's.
var rowMetrics = [][2]Metric{
	{MetricStart, MetricStart},
	{MetricCommit, MetricCommit},
	{MetricCommit, MetricCopyBack},
	{MetricNext, MetricNext},
	{MetricBuiltNext, MetricBuiltNext},
}

// staleable metrics have no sample for a run whose next pod was stale.
func staleable(m Metric) bool { return m == MetricNext || m == MetricBuiltNext }

// Summarize computes the table: per case, the medians of both systems for
// each metric and their ratio.
func Summarize(cases []Case, samples []Sample) ([]Row, error) {
	var rows []Row
	for _, c := range cases {
		for _, pair := range rowMetrics {
			lc, err := collect(samples, Layercache, c.Name, pair[0])
			if err != nil {
				return nil, err
			}
			lp, err := collect(samples, LocalPath, c.Name, pair[1])
			if err != nil {
				return nil, err
			}
			row := Row{
				Case: c.Name, CaseTitle: c.Title, Metric: pair[1], Title: MetricTitles[pair[1]],
				Layercache: lc, LocalPath: lp, Ratio: Ratio(lp.MedianSeconds, lc.MedianSeconds),
			}
			if staleable(pair[1]) {
				row.LayercacheStale, row.LocalPathStale = countStale(samples, Layercache, c.Name), countStale(samples, LocalPath, c.Name)
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

func collect(samples []Sample, s System, caseName string, m Metric) (Stat, error) {
	var xs []float64
	for _, sample := range samples {
		if sample.System != s || sample.Case != caseName {
			continue
		}
		if v, ok := sample.Seconds[m]; ok {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 && staleable(m) && countStale(samples, s, caseName) > 0 {
		return Stat{}, nil // every next pod was stale: the row says so
	}
	st, err := newStat(xs)
	if err != nil {
		return st, fmt.Errorf("%s, case %s, metric %s: %w", s, caseName, m, err)
	}
	return st, nil
}

func countStale(samples []Sample, s System, caseName string) int {
	n := 0
	for _, sample := range samples {
		if sample.System == s && sample.Case == caseName && sample.Stale {
			n++
		}
	}
	return n
}

// CommitSpan splits layercache's MetricCommit in one case: from "built"
// to the test seeing the pod ended (the container's exit and the kubelet's
// report of it), and from there to the test seeing the new generation (the
// node agent seeing the end, its commit and its status report). The
// second can be slightly negative: two watches need not deliver in the
// order the API server wrote.
type CommitSpan struct {
	Case             string `json:"case"`
	CaseTitle        string `json:"caseTitle"`
	BuiltToPodEnded  Stat   `json:"builtToPodEnded"`
	PodEndedToCommit Stat   `json:"podEndedToCommit"`
}

// SummarizeCommitSpans computes the CommitSpans of layercache's samples;
// cases without such samples are left out.
func SummarizeCommitSpans(cases []Case, samples []Sample) []CommitSpan {
	var out []CommitSpan
	for _, c := range cases {
		var toEnd, toCommit []float64
		for _, s := range samples {
			built, ok := s.Markers[MarkBuilt]
			if s.System != Layercache || s.Case != c.Name || !ok || s.PodEnded.IsZero() || s.CommitObserved.IsZero() {
				continue
			}
			toEnd = append(toEnd, s.PodEnded.Sub(built).Seconds())
			toCommit = append(toCommit, s.CommitObserved.Sub(s.PodEnded).Seconds())
		}
		if len(toEnd) == 0 {
			continue
		}
		a, _ := newStat(toEnd)
		b, _ := newStat(toCommit)
		out = append(out, CommitSpan{Case: c.Name, CaseTitle: c.Title, BuiltToPodEnded: a, PodEndedToCommit: b})
	}
	return out
}

// Report is what results.json holds.
type Report struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Backend  string    `json:"backend"`
	Node     string    `json:"node"`
	Runs     int       `json:"runs"`
	Peer     string    `json:"peer"`
	// SameFilesystem tells whether layercache's store and the peer's
	// volumes are on one filesystem, which a fair comparison needs.
	SameFilesystem bool                          `json:"sameFilesystem"`
	Cases          []Case                        `json:"cases"`
	Definitions    map[Metric]string             `json:"definitions"`
	SeedSeconds    map[string]map[System]float64 `json:"seedSeconds,omitempty"`
	Rows           []Row                         `json:"rows"`
	// CommitSpans split layercache's commit metric at the test seeing the
	// pod ended.
	CommitSpans []CommitSpan `json:"commitSpans,omitempty"`
	// WriteRows are layercache's API writes per run and pod; WriteNotes
	// say which counts are missing, and why, and which writes failed.
	WriteRows  []WriteRow `json:"writeRows,omitempty"`
	WriteNotes []string   `json:"writeNotes,omitempty"`
	Samples    []Sample   `json:"samples"`
}

// WriteTable writes the rows as an aligned table.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "case\tmetric\tlayercache median\tlocal-path median\tratio (local-path / layercache)")
	for _, r := range rows {
		ratio := "n/a"
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.CaseTitle, r.Title,
			median(r.Layercache, r.LayercacheStale), median(r.LocalPath, r.LocalPathStale), ratio)
	}
	return tw.Flush()
}

func seconds(s float64) string { return fmt.Sprintf("%.3fs", s) }

// median formats a median, and how many runs had a stale next pod.
func median(st Stat, stale int) string {
	if stale == 0 {
		return seconds(st.MedianSeconds)
	}
	if len(st.SamplesSeconds) == 0 {
		return fmt.Sprintf("n/a (%d stale)", stale)
	}
	return fmt.Sprintf("%s (%d stale)", seconds(st.MedianSeconds), stale)
}

// WriteFiles writes results.json and results.txt (the table and how to
// read it) into dir.
func (r Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results directory: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	var txt strings.Builder
	if err := r.WriteText(&txt); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.txt"), []byte(txt.String()), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	return nil
}

// WriteText writes the table with a header that says what was measured.
func (r Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "layercache vs %s: medians of %d runs per system and case, node %s (%s backend)\n", r.Peer, r.Runs, r.Node, r.Backend)
	if !r.SameFilesystem {
		fmt.Fprintln(w, "WARNING: layercache's store and the peer's volumes are on different filesystems; the comparison is not fair")
	}
	fmt.Fprintln(w)
	if err := WriteTable(w, r.Rows); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, m := range Metrics {
		fmt.Fprintf(w, "%s: %s.\n", MetricTitles[m], MetricDefinitions[m])
	}
	fmt.Fprintln(w, "ratio above 1: layercache is faster.")
	for _, cs := range r.CommitSpans {
		fmt.Fprintf(w, "%s: layercache's commit = build done → pod ended seen %s + pod ended seen → commit seen %s (medians)\n",
			cs.CaseTitle, seconds(cs.BuiltToPodEnded.MedianSeconds), seconds(cs.PodEndedToCommit.MedianSeconds))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "API writes (POST, PUT, PATCH, DELETE) by layercache's processes, from their %s: per layercache run (medians; "+
		"a run completes %d pods: the build pod, which commits, and the next pod, whose commit has no changes), "+
		"the fewest in one run (other tenants of the cluster only ever add), "+
		"the background per second measured during the local-path runs (leader election, other tenants of the cluster), "+
		"and net per pod: the median of (run minus background rate × run length) / %d.\n", RequestsMetric, PodsPerRun, PodsPerRun)
	if len(r.WriteRows) > 0 {
		fmt.Fprintln(w)
		if err := WriteWritesTable(w, r.WriteRows); err != nil {
			return err
		}
	}
	for _, n := range r.WriteNotes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}
