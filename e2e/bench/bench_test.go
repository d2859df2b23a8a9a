package bench

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
)

func TestParseMarkers(t *testing.T) {
	at := func(sec, nsec int64) time.Time { return time.Unix(sec, nsec) }
	tests := []struct {
		name    string
		log     string
		want    Markers
		wantErr string
	}{
		{
			name: "script output with ts's trailing space and other lines",
			log:  "BENCH start 1795354244.256264 \nsome build output\nBENCH ready 1795354245.000001 \nBENCH-SEED files=3\n",
			want: Markers{"start": at(1795354244, 256264000), "ready": at(1795354245, 1000)},
		},
		{name: "nanoseconds", log: "BENCH built 12.123456789", want: Markers{"built": at(12, 123456789)}},
		{name: "whole seconds", log: "BENCH built 12", want: Markers{"built": at(12, 0)}},
		{name: "no markers", log: "hello\n", want: Markers{}},
		{name: "error lines are not markers", log: "BENCH-ERROR the cache is not warm: /cache/seed.done is missing\n", want: Markers{}},
		{name: "twice", log: "BENCH ready 1.5\nBENCH ready 2.5\n", wantErr: "appears twice"},
		{name: "no time", log: "BENCH ready\n", wantErr: "malformed marker line"},
		{name: "signed fraction", log: "BENCH ready 1.+5\n", wantErr: "not unix seconds"},
		{name: "negative", log: "BENCH ready -1.5\n", wantErr: "not unix seconds"},
		{name: "too precise", log: "BENCH ready 1.0123456789\n", wantErr: "more than nine"},
		{name: "date instead of seconds", log: "BENCH ready 2026-11-22T13:24:58\n", wantErr: "not unix seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMarkers(tt.log)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseMarkers() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("ParseMarkers() = %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if !got[k].Equal(v) {
					t.Errorf("marker %s = %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

func TestParseSeedFiles(t *testing.T) {
	tests := []struct {
		log     string
		want    int
		wantErr bool
	}{
		{log: "BENCH-SEED files=50001\n", want: 50001},
		{log: "noise\nBENCH-SEED files=0", want: 0},
		{log: "BENCH-SEED files=many", wantErr: true},
		{log: "awk: write error\n", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseSeedFiles(tt.log)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseSeedFiles(%q) = %d, %v; want %d, error %v", tt.log, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{in: []float64{3}, want: 3},
		{in: []float64{5, 1, 3}, want: 3},
		{in: []float64{4, 1, 3, 2}, want: 2.5},
		{in: []float64{1, 1, 100, 1, 1}, want: 1},
	}
	for _, tt := range tests {
		in := slices.Clone(tt.in)
		got, err := Median(in)
		if err != nil || got != tt.want {
			t.Errorf("Median(%v) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if !slices.Equal(in, tt.in) {
			t.Errorf("Median sorted its input: %v", in)
		}
	}
	if _, err := Median(nil); err == nil {
		t.Error("Median(nil) did not fail")
	}
}

func TestRatio(t *testing.T) {
	tests := []struct{ peer, lc, want float64 }{
		{peer: 10, lc: 2, want: 5},
		{peer: 1, lc: 4, want: 0.25},
		{peer: 1, lc: 0, want: 0},
	}
	for _, tt := range tests {
		if got := Ratio(tt.peer, tt.lc); got != tt.want {
			t.Errorf("Ratio(%v, %v) = %v, want %v", tt.peer, tt.lc, got, tt.want)
		}
	}
}

// markersAt builds markers at the given offsets in seconds from base.
func markersAt(base time.Time, offsets map[string]float64) Markers {
	m := Markers{}
	for k, v := range offsets {
		m[k] = base.Add(time.Duration(v * float64(time.Second)))
	}
	return m
}

func TestNewSample(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	big := Case{Name: "big", Seed: Seed{Files: 50, Bytes: 500}}
	at := func(sec float64) time.Time { return base.Add(time.Duration(sec * float64(time.Second))) }
	warm := map[string]float64{MarkStart: 4, MarkReady: 4.5, MarkWarm: 4.5}
	tests := []struct {
		name     string
		system   System
		markers  map[string]float64
		ended    float64 // seconds after base; 0: not seen
		observed float64 // seconds after base; 0: none
		next     map[string]float64
		want     map[Metric]float64
		stale    bool
		wantErr  string
	}{
		{
			name: "layercache", system: Layercache,
			markers: map[string]float64{MarkStart: 1.5, MarkReady: 1.5, MarkBuilt: 2},
			ended:   2.5, observed: 3.25, next: warm,
			want: map[Metric]float64{MetricStart: 1.5, MetricCommit: 1.25, MetricNext: 2, MetricBuiltNext: 2.5},
		},
		{
			name: "local-path", system: LocalPath,
			markers: map[string]float64{MarkStart: 2, MarkReady: 7, MarkBuilt: 7.5, MarkCopied: 8, MarkCommitted: 9.5},
			ended:   10, next: map[string]float64{MarkStart: 11, MarkReady: 16, MarkWarm: 16},
			want: map[Metric]float64{MetricStart: 7, MetricCommit: 2, MetricCopyBack: 0.5, MetricNext: 6, MetricBuiltNext: 8.5},
		},
		{
			name: "stale next pod: counted, not timed", system: Layercache,
			markers: map[string]float64{MarkStart: 1.5, MarkReady: 1.5, MarkBuilt: 2},
			ended:   2.5, observed: 3.25, next: map[string]float64{MarkStart: 3, MarkReady: 3, MarkStale: 3},
			want:  map[Metric]float64{MetricStart: 1.5, MetricCommit: 1.25},
			stale: true,
		},
		{
			name: "local-path without the copy back", system: LocalPath,
			markers: map[string]float64{MarkStart: 2, MarkReady: 7, MarkBuilt: 7.5},
			ended:   8, next: warm,
			wantErr: "lacks the markers copied, committed",
		},
		{
			name: "layercache commit not seen", system: Layercache,
			markers: map[string]float64{MarkStart: 1, MarkReady: 1, MarkBuilt: 2},
			ended:   3, next: warm,
			wantErr: "no commit was observed",
		},
		{
			name: "pod end not seen", system: Layercache,
			markers:  map[string]float64{MarkStart: 1, MarkReady: 1, MarkBuilt: 2},
			observed: 3, next: warm,
			wantErr: "end was not observed",
		},
		{
			name: "next pod neither warm nor stale", system: Layercache,
			markers: map[string]float64{MarkStart: 1, MarkReady: 1, MarkBuilt: 2},
			ended:   2.5, observed: 3, next: map[string]float64{MarkStart: 3, MarkReady: 3},
			wantErr: "exactly one of the markers warm and stale",
		},
		{
			name: "next pod did not start", system: Layercache,
			markers: map[string]float64{MarkStart: 1, MarkReady: 1, MarkBuilt: 2},
			ended:   2.5, observed: 3, next: map[string]float64{},
			wantErr: "lb-big-3-next",
		},
		{
			name: "clocks disagree", system: Layercache,
			markers: map[string]float64{MarkStart: -2, MarkReady: -1, MarkBuilt: 2},
			ended:   2.5, observed: 3, next: warm,
			wantErr: "share a clock",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := Observed{Submitted: base, Markers: markersAt(base, tt.markers), NextMarkers: markersAt(base, tt.next)}
			if tt.ended != 0 {
				o.PodEnded = at(tt.ended)
			}
			if tt.observed != 0 {
				o.CommitObserved = at(tt.observed)
			}
			got, err := NewSample(tt.system, big, 3, o)
			if tt.wantErr != "" {
				want := strings.ReplaceAll(tt.wantErr, "lb-big-3-next", NextPodName(tt.system, big, 3))
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("NewSample() error = %v, want one containing %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Seconds) != len(tt.want) {
				t.Fatalf("Seconds = %v, want %v", got.Seconds, tt.want)
			}
			for m, v := range tt.want {
				if math.Abs(got.Seconds[m]-v) > 1e-9 {
					t.Errorf("%s = %v, want %v", m, got.Seconds[m], v)
				}
			}
			if got.Stale != tt.stale {
				t.Errorf("Stale = %v, want %v", got.Stale, tt.stale)
			}
			if got.Pod != PodName(tt.system, big, 3) || got.NextPod != NextPodName(tt.system, big, 3) {
				t.Errorf("Pod, NextPod = %s, %s", got.Pod, got.NextPod)
			}
		})
	}
}

func sample(s System, c string, run int, secs map[Metric]float64) Sample {
	return Sample{System: s, Case: c, Run: run, Seconds: secs}
}

func TestSummarize(t *testing.T) {
	cases := []Case{{Name: "empty", Title: "empty cache"}}
	var samples []Sample
	for run, v := range []float64{1, 3, 2} {
		samples = append(samples,
			sample(Layercache, "empty", run, map[Metric]float64{MetricStart: v, MetricCommit: v / 2, MetricNext: v, MetricBuiltNext: 2 * v}),
			sample(LocalPath, "empty", run, map[Metric]float64{MetricStart: 10 * v, MetricCommit: v, MetricCopyBack: v / 4, MetricNext: 3 * v, MetricBuiltNext: 4 * v}),
		)
	}
	rows, err := Summarize(cases, samples)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		metric          Metric
		lc, lp, ratio   float64
		lcSamplesLength int
	}{
		{metric: MetricStart, lc: 2, lp: 20, ratio: 10, lcSamplesLength: 3},
		{metric: MetricCommit, lc: 1, lp: 2, ratio: 2, lcSamplesLength: 3},
		{metric: MetricCopyBack, lc: 1, lp: 0.5, ratio: 0.5, lcSamplesLength: 3},
		{metric: MetricNext, lc: 2, lp: 6, ratio: 3, lcSamplesLength: 3},
		{metric: MetricBuiltNext, lc: 4, lp: 8, ratio: 2, lcSamplesLength: 3},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows, want %d: %+v", len(rows), len(want), rows)
	}
	for i, w := range want {
		r := rows[i]
		if r.Metric != w.metric || r.Layercache.MedianSeconds != w.lc || r.LocalPath.MedianSeconds != w.lp || r.Ratio != w.ratio {
			t.Errorf("row %d = %s lc %v lp %v ratio %v; want %s lc %v lp %v ratio %v",
				i, r.Metric, r.Layercache.MedianSeconds, r.LocalPath.MedianSeconds, r.Ratio, w.metric, w.lc, w.lp, w.ratio)
		}
		if len(r.Layercache.SamplesSeconds) != w.lcSamplesLength || r.CaseTitle != "empty cache" || r.Title != MetricTitles[w.metric] {
			t.Errorf("row %d = %+v", i, r)
		}
	}

	if _, err := Summarize(append(cases, Case{Name: "big"}), samples); err == nil || !strings.Contains(err.Error(), "case big") {
		t.Errorf("Summarize with a case without samples: error = %v, want one naming the case", err)
	}

	// Stale next pods are counted, not timed; a system whose next pods
	// were all stale has no median, which the table says.
	stale := []Sample{
		sample(Layercache, "empty", 0, map[Metric]float64{MetricStart: 1, MetricCommit: 1}),
		sample(Layercache, "empty", 1, map[Metric]float64{MetricStart: 1, MetricCommit: 1}),
		sample(LocalPath, "empty", 0, map[Metric]float64{MetricStart: 1, MetricCommit: 1, MetricCopyBack: 1, MetricNext: 4, MetricBuiltNext: 5}),
		sample(LocalPath, "empty", 1, map[Metric]float64{MetricStart: 1, MetricCommit: 1, MetricCopyBack: 1}),
	}
	stale[0].Stale, stale[1].Stale, stale[3].Stale = true, true, true
	rows, err = Summarize(cases, stale)
	if err != nil {
		t.Fatal(err)
	}
	next := rows[3]
	if next.Metric != MetricNext || next.LayercacheStale != 2 || next.LocalPathStale != 1 || len(next.Layercache.SamplesSeconds) != 0 ||
		next.LocalPath.MedianSeconds != 4 || next.Ratio != 0 {
		t.Errorf("next-pod row with stale runs = %+v", next)
	}
	var txt strings.Builder
	if err := WriteTable(&txt, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(txt.String(), "n/a (2 stale)") || !strings.Contains(txt.String(), "4.000s (1 stale)") {
		t.Errorf("table does not show the stale runs:\n%s", txt.String())
	}
	if rows[0].LayercacheStale != 0 {
		t.Errorf("the start row counts stale runs: %+v", rows[0])
	}
}

func TestSummarizeCommitSpans(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	at := func(sec float64) time.Time { return base.Add(time.Duration(sec * float64(time.Second))) }
	cases := []Case{{Name: "empty", Title: "empty cache"}, {Name: "big", Title: "big"}}
	var samples []Sample
	for run, end := range []float64{1.3, 1.1, 1.2} {
		samples = append(samples,
			Sample{System: Layercache, Case: "empty", Run: run, Markers: Markers{MarkBuilt: base}, PodEnded: at(end), CommitObserved: at(end + 0.05)},
			Sample{System: LocalPath, Case: "empty", Run: run, Markers: Markers{MarkBuilt: base}, PodEnded: at(9)})
	}
	// The commit's watch may deliver before the pod's.
	samples = append(samples, Sample{System: Layercache, Case: "big", Markers: Markers{MarkBuilt: base}, PodEnded: at(1), CommitObserved: at(0.99)})
	got := SummarizeCommitSpans(cases, samples)
	if len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	if e := got[0]; e.Case != "empty" || math.Abs(e.BuiltToPodEnded.MedianSeconds-1.2) > 1e-9 || math.Abs(e.PodEndedToCommit.MedianSeconds-0.05) > 1e-9 || len(e.BuiltToPodEnded.SamplesSeconds) != 3 {
		t.Errorf("empty = %+v", e)
	}
	if b := got[1]; math.Abs(b.PodEndedToCommit.MedianSeconds+0.01) > 1e-9 {
		t.Errorf("big = %+v", b)
	}
	if got := SummarizeCommitSpans(cases, nil); len(got) != 0 {
		t.Errorf("no samples: %+v", got)
	}
}

func TestReportFiles(t *testing.T) {
	rows := []Row{
		{Case: "empty", CaseTitle: "empty cache", Metric: MetricStart, Title: MetricTitles[MetricStart],
			Layercache: Stat{MedianSeconds: 1.5, SamplesSeconds: []float64{1.5}}, LocalPath: Stat{MedianSeconds: 4.5, SamplesSeconds: []float64{4.5}}, Ratio: 3},
		{Case: "empty", CaseTitle: "empty cache", Metric: MetricCommit, Title: MetricTitles[MetricCommit],
			Layercache: Stat{SamplesSeconds: []float64{0}}, LocalPath: Stat{MedianSeconds: 0.25, SamplesSeconds: []float64{0.25}}},
	}
	r := Report{
		Started: time.Unix(100, 0).UTC(), Finished: time.Unix(200, 0).UTC(), Backend: "local", Node: "layercache-node1", Runs: 1,
		Peer: Peer, SameFilesystem: true, Cases: []Case{{Name: "empty", Title: "empty cache"}},
		Definitions: MetricDefinitions, Rows: rows,
		WriteRows: []WriteRow{{Case: "empty", CaseTitle: "empty cache", Component: ComponentNode, Method: "PATCH",
			PerRun: CountStat{Median: 6, Samples: []float64{6}}, BackgroundPerSecond: CountStat{Samples: []float64{0}}, NetPerPod: 3}},
		WriteNotes: []string{"empty cache, manager: no writes counted; its metrics could not be read"},
		Samples: []Sample{{System: Layercache, Case: "empty", Pod: "lc-empty-0", Submitted: time.Unix(100, 0).UTC(),
			Markers: Markers{MarkReady: time.Unix(101, 500_000_000).UTC()}, Seconds: map[Metric]float64{MetricStart: 1.5}}},
	}
	dir := t.TempDir()
	if err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Errorf("results.json does not round-trip:\n got %+v\nwant %+v", back, r)
	}
	txt, err := os.ReadFile(filepath.Join(dir, "results.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ratio (local-path / layercache)",
		"empty cache  claim created → build can start  1.500s",
		"4.500s             3.00",
		"0.250s             n/a",
		"ratio above 1: layercache is faster.",
		"empty cache  node agent  PATCH   6                            6                0.00              3.0",
		"note: empty cache, manager: no writes counted",
		MetricTitles[MetricNext] + ": from the test's watch",
	} {
		if !strings.Contains(string(txt), want) {
			t.Errorf("results.txt lacks %q:\n%s", want, txt)
		}
	}
	if strings.Contains(string(txt), "WARNING") {
		t.Errorf("results.txt warns although the filesystems are the same:\n%s", txt)
	}
}

func TestOptionsFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    Options
		wantErr []string
	}{
		{name: "defaults", want: DefaultOptions()},
		{
			name: "overrides",
			env:  map[string]string{"BENCH_RUNS": "3", "BENCH_BIG_FILES": "100", "BENCH_BIG_BYTES": "10Mi", "BENCH_NODE": "layercache-node2", "BENCH_OUTPUT": "/tmp/out"},
			want: Options{Runs: 3, BigFiles: 100, BigBytes: 10 << 20, Node: "layercache-node2", Output: "/tmp/out"},
		},
		{name: "not numbers", env: map[string]string{"BENCH_RUNS": "five", "BENCH_BIG_FILES": "lots", "BENCH_BIG_BYTES": "big"}, wantErr: []string{"BENCH_RUNS=\"five\"", "BENCH_BIG_FILES=\"lots\"", "BENCH_BIG_BYTES=\"big\""}},
		{name: "no runs", env: map[string]string{"BENCH_RUNS": "0"}, wantErr: []string{"BENCH_RUNS=0 is out of range"}},
		{name: "runs that would squash", env: map[string]string{"BENCH_RUNS": "31"}, wantErr: []string{"squash"}},
		{name: "files not spread evenly", env: map[string]string{"BENCH_BIG_FILES": "50001"}, wantErr: []string{"multiple of 50"}},
		{name: "fewer bytes than files", env: map[string]string{"BENCH_BIG_BYTES": "100"}, wantErr: []string{"one byte per file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := OptionsFromEnv(func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok })
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("OptionsFromEnv() = %+v, want an error", got)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("OptionsFromEnv() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestCases(t *testing.T) {
	cases, err := DefaultOptions().Cases()
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 2 {
		t.Fatalf("got %d cases, want 2", len(cases))
	}
	empty, big := cases[0], cases[1]
	if !empty.Seed.Empty() || empty.Shared() {
		t.Errorf("case %s is not an empty cache of its own per run: %+v", empty.Name, empty)
	}
	if big.Seed != (Seed{Files: 50_000, Bytes: 1 << 30}) || !big.Shared() {
		t.Errorf("case %s = %+v, want a shared cache of 1 GiB in 50000 files", big.Name, big)
	}
	if big.Title != "1.0GiB in 50000 files" {
		t.Errorf("title %q", big.Title)
	}
	if got := empty.CacheName(1); got != "bench-empty-1" || empty.CacheName(2) == got {
		t.Errorf("empty runs share cache %s", got)
	}
	if big.CacheName(1) != big.CacheName(2) {
		t.Errorf("big runs do not share a cache")
	}
	if got := big.Expect(0); !slices.Equal(got, []string{"seed.done"}) {
		t.Errorf("big.Expect(0) = %v", got)
	}
	if got := big.Expect(3); !slices.Equal(got, []string{"seed.done", "runs/2"}) {
		t.Errorf("big.Expect(3) = %v", got)
	}
	if got := empty.Expect(3); got != nil {
		t.Errorf("empty.Expect(3) = %v, want nothing", got)
	}
	if empty.StoreDir(0) == empty.StoreDir(1) || big.StoreDir(0) != big.StoreDir(1) {
		t.Errorf("store dirs: empty %s %s, big %s %s", empty.StoreDir(0), empty.StoreDir(1), big.StoreDir(0), big.StoreDir(1))
	}
}

func TestRunPod(t *testing.T) {
	cases, err := Options{Runs: 5, BigFiles: 50_000, BigBytes: 1 << 30, Output: "x"}.Cases()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		for _, run := range []int{0, 4} {
			lc, lp := RunPod(Layercache, c, run, "layercache-node1"), RunPod(LocalPath, c, run, "layercache-node1")
			for _, p := range []*corev1.Pod{lc, lp} {
				checkPod(t, p)
				if v := claimVolume(t, p); !strings.HasPrefix(ClaimName(p.Name), p.Name) || v.Spec.AccessModes[0] != corev1.ReadWriteOnce {
					t.Errorf("pod %s: cache volume %+v", p.Name, v)
				}
			}
			// Same workload: only the volume and the store differ.
			if !reflect.DeepEqual(lc.Spec.Containers[0].Command, lp.Spec.Containers[0].Command) || lc.Spec.NodeSelector[corev1.LabelHostname] != lp.Spec.NodeSelector[corev1.LabelHostname] {
				t.Errorf("case %s run %d: the pods run different workloads", c.Name, run)
			}
			if v := claimVolume(t, lc); *v.Spec.StorageClassName != v1alpha1.StorageClassName || v.Annotations[v1alpha1.AnnotationCache] != c.CacheName(run) {
				t.Errorf("layercache pod %s: claim template %+v", lc.Name, v)
			}
			if v := claimVolume(t, lp); *v.Spec.StorageClassName != PeerStorageClass || len(v.Annotations) != 0 {
				t.Errorf("local-path pod %s: claim template %+v", lp.Name, v)
			}
			if got := env(lc, "BENCH_STORE"); got != "" {
				t.Errorf("layercache pod %s copies from a store %q", lc.Name, got)
			}
			if got := env(lp, "BENCH_STORE"); got != c.StoreDir(run) {
				t.Errorf("local-path pod %s: BENCH_STORE = %q, want %q", lp.Name, got, c.StoreDir(run))
			}
			if got := env(lp, "BENCH_EXPECT"); got != strings.Join(c.Expect(run), " ") || got != env(lc, "BENCH_EXPECT") {
				t.Errorf("pods %s, %s: BENCH_EXPECT = %q, %q", lc.Name, lp.Name, env(lc, "BENCH_EXPECT"), got)
			}
			if store := lp.Spec.Volumes[1].PersistentVolumeClaim; store == nil || store.ClaimName != c.StoreClaim() || len(lc.Spec.Volumes) != 1 {
				t.Errorf("local-path pod %s: volumes %+v", lp.Name, lp.Spec.Volumes)
			}
		}
		if errs := validation.IsDNS1123Label(c.CacheName(0)); len(errs) > 0 {
			t.Errorf("cache name %s: %v", c.CacheName(0), errs)
		}
	}
}

func TestSeedPod(t *testing.T) {
	cases, err := DefaultOptions().Cases()
	if err != nil {
		t.Fatal(err)
	}
	empty, big := cases[0], cases[1]
	lc := SeedPod(Layercache, big, "n")
	checkPod(t, lc)
	if v := claimVolume(t, lc); v.Annotations[v1alpha1.AnnotationCache] != "bench-big" || env(lc, "BENCH_SEED_DIR") != CacheMount {
		t.Errorf("layercache seed pod: %+v", lc.Spec)
	}
	lp := SeedPod(LocalPath, big, "n")
	checkPod(t, lp)
	if env(lp, "BENCH_SEED_DIR") != big.StoreDir(0) || lp.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != big.StoreClaim() {
		t.Errorf("local-path seed pod: %+v", lp.Spec)
	}
	for _, p := range []*corev1.Pod{lc, lp} {
		if env(p, "BENCH_SEED_FILES") != "50000" || env(p, "BENCH_SEED_BYTES") != strconv.Itoa(1<<30) {
			t.Errorf("seed pod %s: env %+v", p.Name, p.Spec.Containers[0].Env)
		}
	}
	if p := SeedPod(LocalPath, empty, "n"); env(p, "BENCH_SEED_FILES") != "0" {
		t.Errorf("empty store seed pod writes files: %+v", p.Spec.Containers[0].Env)
	}
	if c := StoreClaim(big); *c.Spec.StorageClassName != PeerStorageClass || c.Name != big.StoreClaim() {
		t.Errorf("store claim %+v", c)
	}
}

func checkPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if errs := validation.IsDNS1123Subdomain(p.Name); len(errs) > 0 {
		t.Errorf("pod name %s: %v", p.Name, errs)
	}
	if errs := validation.IsDNS1123Subdomain(ClaimName(p.Name)); len(errs) > 0 {
		t.Errorf("claim name %s: %v", ClaimName(p.Name), errs)
	}
	c := p.Spec.Containers[0]
	if c.Image != ImageBusybox || c.ImagePullPolicy != corev1.PullNever || p.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("pod %s: image %s, pull %s, restart %s", p.Name, c.Image, c.ImagePullPolicy, p.Spec.RestartPolicy)
	}
	if p.Spec.NodeName != "" || p.Spec.NodeSelector[corev1.LabelHostname] == "" {
		t.Errorf("pod %s must select its node and leave nodeName to the scheduler: %+v", p.Name, p.Spec)
	}
}

func claimVolume(t *testing.T, p *corev1.Pod) *corev1.PersistentVolumeClaimTemplate {
	t.Helper()
	for _, v := range p.Spec.Volumes {
		if v.Ephemeral != nil && v.Name == "cache" {
			return v.Ephemeral.VolumeClaimTemplate
		}
	}
	t.Fatalf("pod %s has no ephemeral cache volume", p.Name)
	return nil
}

func env(p *corev1.Pod, name string) string {
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestScriptMarkers keeps the script and the markers NewSample needs in
// step: every marker is printed, in the order of the workload.
func TestScriptMarkers(t *testing.T) {
	last := -1
	for _, m := range []string{MarkStart, MarkReady, MarkBuilt, MarkCopied, MarkCommitted} {
		i := strings.Index(Script, "mark "+m+"\n")
		if i < 0 {
			t.Fatalf("Script does not print marker %s", m)
		}
		if i < last {
			t.Errorf("Script prints marker %s out of order", m)
		}
		last = i
	}
	last = -1
	for _, m := range []string{MarkStart, MarkReady, MarkWarm, MarkStale} {
		i := strings.Index(NextScript, "mark "+m+"\n")
		if i < 0 {
			t.Fatalf("NextScript does not print marker %s", m)
		}
		if i < last {
			t.Errorf("NextScript prints marker %s out of order", m)
		}
		last = i
	}
}

// TestSeedScript runs the seed generator with the host's shell and awk:
// the sizes must add up exactly, and the count it prints must match.
func TestSeedScript(t *testing.T) {
	for _, tool := range []string{"sh", "awk", "find", "wc", "sync"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s on PATH: %v", tool, err)
		}
	}
	seed, err := NewSeed(100, 100*37+13)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "seed")
	cmd := exec.Command("sh", "-c", SeedScript)
	cmd.Env = append(os.Environ(),
		"BENCH_SEED_DIR="+dir,
		"BENCH_SEED_FILES="+strconv.Itoa(seed.Files),
		"BENCH_SEED_BYTES="+strconv.FormatInt(seed.Bytes, 10),
		"BENCH_SEED_DIRS="+strconv.Itoa(seedDirs),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("seed script: %v\n%s", err, out)
	}
	n, err := ParseSeedFiles(string(out))
	if err != nil || n != SeedFiles(seed) {
		t.Fatalf("seed script reported %d files (%v), want %d:\n%s", n, err, SeedFiles(seed), out)
	}
	var files int
	var bytes int64
	dirs := map[string]bool{}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "seed.done" {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files++
		bytes += info.Size()
		dirs[filepath.Dir(p)] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files != seed.Files || bytes != seed.Bytes || len(dirs) != seedDirs {
		t.Errorf("seed wrote %d files, %d bytes in %d directories; want %d, %d, %d", files, bytes, len(dirs), seed.Files, seed.Bytes, seedDirs)
	}
}

// TestPeerManifest checks the adaptations of local-path-provisioner's
// deploy manifest to the local cluster, and that the names the benchmark
// uses are the ones deployed.
func TestPeerManifest(t *testing.T) {
	objs, err := PeerObjects()
	if err != nil {
		t.Fatal(err)
	}
	var (
		dep      *appsv1.Deployment
		sc       *storagev1.StorageClass
		cm       *corev1.ConfigMap
		accounts = map[string]bool{}
		bindings []rbacv1.Subject
	)
	for _, o := range objs {
		m, err := meta.Accessor(o)
		if err != nil {
			t.Fatal(err)
		}
		if m.GetLabels()["app.kubernetes.io/part-of"] != "layercache-bench" {
			t.Errorf("%T %s lacks the label app.kubernetes.io/part-of=layercache-bench", o, m.GetName())
		}
		if m.GetNamespace() != "" && m.GetNamespace() != PeerNamespace {
			t.Errorf("%T %s is in namespace %s, want %s", o, m.GetName(), m.GetNamespace(), PeerNamespace)
		}
		switch o := o.(type) {
		case *appsv1.Deployment:
			dep = o
		case *storagev1.StorageClass:
			sc = o
		case *corev1.ConfigMap:
			cm = o
		case *corev1.ServiceAccount:
			accounts[o.Name] = true
		case *rbacv1.RoleBinding:
			bindings = append(bindings, o.Subjects...)
		case *rbacv1.ClusterRoleBinding:
			bindings = append(bindings, o.Subjects...)
		case *corev1.Namespace:
			if o.Name != PeerNamespace {
				t.Errorf("namespace %s, want %s", o.Name, PeerNamespace)
			}
		}
	}
	if dep == nil || sc == nil || cm == nil {
		t.Fatalf("manifest lacks the Deployment, StorageClass or ConfigMap: %d objects", len(objs))
	}

	if dep.Name != PeerDeployment {
		t.Errorf("Deployment %s, want %s", dep.Name, PeerDeployment)
	}
	pod := dep.Spec.Template.Spec
	if !pod.HostNetwork {
		t.Error("the provisioner must use the host network: the API server listens on 127.0.0.1")
	}
	if !accounts[pod.ServiceAccountName] {
		t.Errorf("service account %s is not in the manifest", pod.ServiceAccountName)
	}
	for _, s := range bindings {
		if s.Kind == "ServiceAccount" && (s.Name != pod.ServiceAccountName || s.Namespace != PeerNamespace) {
			t.Errorf("a binding names %s/%s, want %s/%s", s.Namespace, s.Name, PeerNamespace, pod.ServiceAccountName)
		}
	}
	c := pod.Containers[0]
	if c.Image != PeerImage || c.ImagePullPolicy != corev1.PullNever || c.Command[0] != "/local-path-provisioner" {
		t.Errorf("container: image %s, pull %s, command %v; want %s, Never, /local-path-provisioner (run.sh builds it so)", c.Image, c.ImagePullPolicy, c.Command, PeerImage)
	}
	wantEnv := map[string]string{
		"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443",
		"PROVISIONER_NAME": PeerProvisioner, "CONFIG_MOUNT_PATH": "/etc/config/",
	}
	for _, e := range c.Env {
		if want, ok := wantEnv[e.Name]; ok {
			if e.Value != want {
				t.Errorf("env %s = %q, want %q", e.Name, e.Value, want)
			}
			delete(wantEnv, e.Name)
		}
	}
	if len(wantEnv) > 0 {
		t.Errorf("container lacks env %v", wantEnv)
	}
	if pod.Volumes[0].ConfigMap == nil || pod.Volumes[0].ConfigMap.Name != cm.Name || cm.Name != PeerConfigMap {
		t.Errorf("config volume %+v does not mount ConfigMap %s", pod.Volumes[0], PeerConfigMap)
	}

	if sc.Name != PeerStorageClass || sc.Provisioner != PeerProvisioner ||
		sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer ||
		sc.ReclaimPolicy == nil || *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("StorageClass %+v, want %s by %s, WaitForFirstConsumer, Delete", sc, PeerStorageClass, PeerProvisioner)
	}

	var config struct {
		NodePathMap []struct {
			Node  string   `json:"node"`
			Paths []string `json:"paths"`
		} `json:"nodePathMap"`
	}
	if err := json.Unmarshal([]byte(cm.Data["config.json"]), &config); err != nil {
		t.Fatalf("config.json: %v", err)
	}
	if len(config.NodePathMap) != 1 || config.NodePathMap[0].Node != "DEFAULT_PATH_FOR_NON_LISTED_NODES" ||
		!slices.Equal(config.NodePathMap[0].Paths, []string{PeerNodePath}) {
		t.Errorf("config.json = %+v, want every node's volumes in %s", config, PeerNodePath)
	}
	for _, script := range []string{"setup", "teardown"} {
		if !strings.Contains(cm.Data[script], `"$VOL_DIR"`) {
			t.Errorf("ConfigMap lacks the %s script", script)
		}
	}
	var helper corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(cm.Data["helperPod.yaml"]), &helper); err != nil {
		t.Fatalf("helperPod.yaml: %v", err)
	}
	if hc := helper.Spec.Containers; len(hc) != 1 || hc[0].Image != ImageBusybox || hc[0].ImagePullPolicy != corev1.PullNever {
		t.Errorf("helper pod containers %+v, want one of %s, never pulled", hc, ImageBusybox)
	}
}
