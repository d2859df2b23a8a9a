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
	MetricStart    Metric = "start"
	MetricCommit   Metric = "commit"
	MetricCopyBack Metric = "copy-back"
)

// MetricTitles name the metrics in the table.
var MetricTitles = map[Metric]string{
	MetricStart:    "claim created → build can start",
	MetricCommit:   "build done → cache committed",
	MetricCopyBack: "build done → committed, local-path without sync",
}

// MetricDefinitions go into results.json, so that it explains itself.
var MetricDefinitions = map[Metric]string{
	MetricStart: "from the test submitting the build pod (its generic ephemeral volume makes the claim) to the in-pod marker 'ready': " +
		"at container start for layercache, after copying the cache from the store into the new volume (cp -a) for local-path",
	MetricCommit: "from the in-pod marker 'built' to the cache being durably committed: for layercache the test's watch seeing the Cache's " +
		"status entry of the node at a newer generation (pod end, manager release, node agent commit with syncfs, status report); " +
		"for local-path the in-pod marker 'committed' after copying the changes back (cp -a -u) and sync -f",
	MetricCopyBack: "local-path: from 'built' to the in-pod marker 'copied', the copy back without sync; layercache: its commit metric",
}

// Sample is one build pod's run.
type Sample struct {
	System System `json:"system"`
	Case   string `json:"case"`
	Run    int    `json:"run"`
	Pod    string `json:"pod"`
	// Submitted is when the test submitted the pod.
	Submitted time.Time `json:"submitted"`
	Markers   Markers   `json:"markers"`
	// CommitObserved is when the test saw layercache's commit.
	CommitObserved time.Time `json:"commitObserved,omitzero"`
	// Seconds holds the metrics of this run.
	Seconds map[Metric]float64 `json:"seconds"`
}

// NewSample computes a run's metrics from the times the test and the
// script recorded.
func NewSample(s System, c Case, run int, submitted time.Time, m Markers, commitObserved time.Time) (Sample, error) {
	sample := Sample{
		System: s, Case: c.Name, Run: run, Pod: PodName(s, c, run),
		Submitted: submitted, Markers: m, CommitObserved: commitObserved,
		Seconds: map[Metric]float64{},
	}
	need := []string{MarkStart, MarkReady, MarkBuilt}
	if s == LocalPath {
		need = append(need, MarkCopied, MarkCommitted)
	}
	if err := m.Require(need...); err != nil {
		return sample, fmt.Errorf("pod %s: %w", sample.Pod, err)
	}
	spans := map[Metric][2]time.Time{MetricStart: {submitted, m[MarkReady]}}
	switch s {
	case Layercache:
		if commitObserved.IsZero() {
			return sample, fmt.Errorf("pod %s: no commit was observed", sample.Pod)
		}
		spans[MetricCommit] = [2]time.Time{m[MarkBuilt], commitObserved}
	case LocalPath:
		spans[MetricCommit] = [2]time.Time{m[MarkBuilt], m[MarkCommitted]}
		spans[MetricCopyBack] = [2]time.Time{m[MarkBuilt], m[MarkCopied]}
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
}

// rowMetrics pairs the metric of each row: layercache's metric, local-path's.
var rowMetrics = [][2]Metric{
	{MetricStart, MetricStart},
	{MetricCommit, MetricCommit},
	{MetricCommit, MetricCopyBack},
}

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
			rows = append(rows, Row{
				Case: c.Name, CaseTitle: c.Title, Metric: pair[1], Title: MetricTitles[pair[1]],
				Layercache: lc, LocalPath: lp, Ratio: Ratio(lp.MedianSeconds, lc.MedianSeconds),
			})
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
	st, err := newStat(xs)
	if err != nil {
		return st, fmt.Errorf("%s, case %s, metric %s: %w", s, caseName, m, err)
	}
	return st, nil
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
	Samples        []Sample                      `json:"samples"`
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
			seconds(r.Layercache.MedianSeconds), seconds(r.LocalPath.MedianSeconds), ratio)
	}
	return tw.Flush()
}

func seconds(s float64) string { return fmt.Sprintf("%.3fs", s) }

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
	for _, m := range []Metric{MetricStart, MetricCommit, MetricCopyBack} {
		fmt.Fprintf(w, "%s: %s.\n", MetricTitles[m], MetricDefinitions[m])
	}
	_, err := fmt.Fprintln(w, "ratio above 1: layercache is faster.")
	return err
}
