package bench

import (
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// metricsPage is an excerpt of what controller-runtime serves on /metrics.
const metricsPage = `# HELP rest_client_requests_total Number of HTTP requests, partitioned by status code, method, and host.
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="GET"} 18
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="PATCH"} 7
rest_client_requests_total{code="201",host="127.0.0.1:6443",method="POST"} 3
rest_client_requests_total{code="409",host="127.0.0.1:6443",method="PATCH"} 1
rest_client_requests_total{code="200",host="10.0.0.1:6443",method="PUT"} 2.5e+01
# HELP rest_client_requests_total_other a metric whose name starts with the same words
rest_client_requests_total_other{method="POST"} 99
rest_client_request_duration_seconds_bucket{host="127.0.0.1:6443",verb="GET",le="0.005"} 12
`

func TestParseCounters(t *testing.T) {
	got, err := ParseCounters(metricsPage, RequestsMetric)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("got %d series, want 5: %+v", len(got), got)
	}
	if got[4].Value != 25 || got[4].Labels["host"] != "10.0.0.1:6443" || got[4].Labels["method"] != "PUT" {
		t.Errorf("last series = %+v", got[4])
	}

	tests := []struct {
		name, text string
		want       []Counter
		wantErr    string
	}{
		{name: "no labels, timestamp", text: "up 1 1700000000000\n", want: []Counter{{Labels: map[string]string{}, Value: 1}}},
		{name: "escapes and spaces", text: `up{a="x\"y",b="l\\n", c = "m\nn" } 2` + "\n",
			want: []Counter{{Labels: map[string]string{"a": `x"y`, "b": `l\n`, "c": "m\nn"}, Value: 2}}},
		{name: "trailing comma", text: `up{a="x",} 3`, want: []Counter{{Labels: map[string]string{"a": "x"}, Value: 3}}},
		{name: "unquoted value", text: `up{a=x} 1`, wantErr: "not quoted"},
		{name: "unterminated", text: `up{a="x} 1`, wantErr: "unterminated"},
		{name: "no value", text: `up{a="x"}`, wantErr: "want a value"},
		{name: "bad value", text: `up{a="x"} many`, wantErr: "value"},
		{name: "garbage between labels", text: `up{a="x" b="y"} 1`, wantErr: "want , or }"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCounters(tt.text, "up")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i].Value != tt.want[i].Value || !maps.Equal(got[i].Labels, tt.want[i].Labels) {
					t.Errorf("series %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestParseRequests(t *testing.T) {
	r, err := ParseRequests(metricsPage)
	if err != nil {
		t.Fatal(err)
	}
	want := Requests{{"GET", "200"}: 18, {"PATCH", "200"}: 7, {"POST", "201"}: 3, {"PATCH", "409"}: 1, {"PUT", "200"}: 25}
	if !maps.Equal(r, want) {
		t.Errorf("ParseRequests = %v, want %v", r, want)
	}
	if _, err := ParseRequests("# nothing here\nup 1\n"); err == nil || !strings.Contains(err.Error(), RequestsMetric) {
		t.Errorf("a page without the metric: error = %v", err)
	}
}

func TestRequestsSub(t *testing.T) {
	before := Requests{{"GET", "200"}: 18, {"PATCH", "200"}: 7, {"PUT", "200"}: 25}
	after := Requests{{"GET", "200"}: 30, {"PATCH", "200"}: 10, {"PUT", "200"}: 25, {"POST", "201"}: 2, {"PATCH", "409"}: 1, {"DELETE", "200"}: 1}
	d, err := after.Sub(before)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Requests{{"GET", "200"}: 12, {"PATCH", "200"}: 3, {"POST", "201"}: 2, {"PATCH", "409"}: 1, {"DELETE", "200"}: 1}); !maps.Equal(d, want) {
		t.Errorf("Sub = %v, want %v", d, want)
	}
	if w, want := d.Writes(), map[string]float64{"POST": 2, "PUT": 0, "PATCH": 4, "DELETE": 1}; !maps.Equal(w, want) {
		t.Errorf("Writes = %v, want %v", w, want)
	}
	if f, want := d.FailedWrites(), map[string]float64{"PATCH 409": 1}; !maps.Equal(f, want) {
		t.Errorf("FailedWrites = %v, want %v", f, want)
	}

	if _, err := before.Sub(after); err == nil || !strings.Contains(err.Error(), "restarted") {
		t.Errorf("counters that went down: error = %v, want a restart", err)
	}
	if _, err := (Requests{{"GET", "200"}: 1}).Sub(before); err == nil || !strings.Contains(err.Error(), "restarted") {
		t.Errorf("a series that disappeared: error = %v, want a restart", err)
	}
}

func TestNewWriteWindow(t *testing.T) {
	before := map[string]Requests{
		ComponentNode:    {{"PATCH", "200"}: 1},
		ComponentManager: {{"PUT", "200"}: 10},
	}
	after := map[string]Requests{
		ComponentNode:    {{"PATCH", "200"}: 4, {"POST", "201"}: 2},
		ComponentManager: {{"PUT", "200"}: 9},
	}
	w := NewWriteWindow(8, before, after, nil)
	if got := w.Writes[ComponentNode]; got["PATCH"] != 3 || got["POST"] != 2 || got["PUT"] != 0 || got["DELETE"] != 0 {
		t.Errorf("node agent writes = %v", got)
	}
	if _, ok := w.Writes[ComponentManager]; ok || !strings.Contains(w.Unavailable[ComponentManager], "restarted") {
		t.Errorf("a manager that restarted is counted: %+v", w)
	}

	w = NewWriteWindow(8, before, map[string]Requests{ComponentManager: after[ComponentManager]}, map[string]string{ComponentNode: "no metrics port"})
	if w.Unavailable[ComponentNode] != "no metrics port" {
		t.Errorf("unavailable = %v", w.Unavailable)
	}
	w = NewWriteWindow(8, map[string]Requests{}, after, nil)
	if w.Unavailable[ComponentNode] != "not scraped" {
		t.Errorf("a component scraped once only: %v", w.Unavailable)
	}
}

func TestSummarizeWrites(t *testing.T) {
	cases := []Case{{Name: "big", Title: "big cache"}}
	window := func(secs float64, node, manager map[string]float64) *WriteWindow {
		return &WriteWindow{Seconds: secs, Writes: map[string]map[string]float64{ComponentNode: node, ComponentManager: manager}}
	}
	w := func(post, put, patch, del float64) map[string]float64 {
		return map[string]float64{"POST": post, "PUT": put, "PATCH": patch, "DELETE": del}
	}
	var samples []Sample
	for run, secs := range []float64{10, 10, 20} {
		lc := Sample{System: Layercache, Case: "big", Run: run, Writes: window(secs, w(6, 0, 6, 2), w(0, secs/2, 2, 0))}
		// Background: the manager renews its lease every 2 s.
		lp := Sample{System: LocalPath, Case: "big", Run: run, Writes: window(4*secs, w(0, 0, 0, 0), w(0, 2*secs, 0, 0))}
		samples = append(samples, lc, lp)
	}
	// A run whose node agent could not be read is left out and noted.
	samples = append(samples, Sample{System: Layercache, Case: "big", Run: 3, Writes: &WriteWindow{
		Seconds: 10, Writes: map[string]map[string]float64{ComponentManager: w(0, 5, 2, 0)},
		Unavailable: map[string]string{ComponentNode: "no metrics port"},
	}})
	rows, notes := SummarizeWrites(cases, samples)
	if len(rows) != len(Components)*len(WriteMethods) {
		t.Fatalf("got %d rows, want %d", len(rows), len(Components)*len(WriteMethods))
	}
	get := func(comp, method string) WriteRow {
		for _, r := range rows {
			if r.Component == comp && r.Method == method {
				return r
			}
		}
		t.Fatalf("no row %s %s", comp, method)
		return WriteRow{}
	}
	if r := get(ComponentNode, "POST"); r.PerRun.Median != 6 || len(r.PerRun.Samples) != 3 || r.NetPerPod != 3 {
		t.Errorf("node agent POST = %+v", r)
	}
	if r := get(ComponentNode, "DELETE"); r.NetPerPod != 1 {
		t.Errorf("node agent DELETE = %+v", r)
	}
	// The manager's PUTs are its lease: background only, none net.
	if r := get(ComponentManager, "PUT"); r.PerRun.Median != 5 || r.BackgroundPerSecond.Median != 0.5 || math.Abs(r.NetPerPod) > 1e-9 || len(r.PerRun.Samples) != 4 {
		t.Errorf("manager PUT = %+v", r)
	}
	if r := get(ComponentManager, "PATCH"); r.NetPerPod != 1 {
		t.Errorf("manager PATCH = %+v", r)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "run 3: no metrics port") {
		t.Errorf("notes = %q", notes)
	}

	// Nothing readable at all: notes, no rows, no invented numbers.
	rows, notes = SummarizeWrites(cases, []Sample{{System: Layercache, Case: "big", Writes: &WriteWindow{
		Seconds: 10, Unavailable: map[string]string{ComponentNode: "x", ComponentManager: "y"},
	}}})
	if len(rows) != 0 || len(notes) != 4 || !strings.Contains(notes[1], "could not be read") {
		t.Errorf("rows %+v, notes %q", rows, notes)
	}

	samples[0].Writes.Failed = map[string]map[string]float64{ComponentNode: {"PATCH 409": 1}}
	samples[2].Writes.Failed = map[string]map[string]float64{ComponentNode: {"PATCH 409": 2, "POST 500": 1}}
	if got := FailedWriteNotes(cases, samples); len(got) != 1 || !strings.Contains(got[0], "PATCH 409 ×3, POST 500 ×1") {
		t.Errorf("FailedWriteNotes = %q", got)
	}
}

func TestNextPod(t *testing.T) {
	cases, err := DefaultOptions().Cases()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		lc, lp := NextPod(Layercache, c, 2, "n"), NextPod(LocalPath, c, 2, "n")
		for _, p := range []*corev1.Pod{lc, lp} {
			checkPod(t, p)
			if p.Name == PodName(Layercache, c, 2) || p.Name == PodName(LocalPath, c, 2) || env(p, "BENCH_PREV") != "runs/2" {
				t.Errorf("next pod %s: env %+v", p.Name, p.Spec.Containers[0].Env)
			}
		}
		if v := claimVolume(t, lc); v.Annotations[v1alpha1.AnnotationCache] != c.CacheName(2) {
			t.Errorf("layercache next pod %s names cache %q, want the build's %s", lc.Name, v.Annotations[v1alpha1.AnnotationCache], c.CacheName(2))
		}
		if env(lp, "BENCH_STORE") != c.StoreDir(2) || lp.Spec.Volumes[1].PersistentVolumeClaim.ClaimName != c.StoreClaim() || env(lc, "BENCH_STORE") != "" {
			t.Errorf("next pods' stores: %+v, %+v", lp.Spec, lc.Spec)
		}
	}
}

// TestNextScript runs the next pod's script with the host's shell and a
// stand-in for ts: it copies the store in, and reports warm or stale.
func TestNextScript(t *testing.T) {
	for _, tool := range []string{"sh", "cp", "mkdir"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s on PATH: %v", tool, err)
		}
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "ts"), []byte("#!/bin/sh\necho 1795354244.256264\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, cacheDir, store string) Markers {
		t.Helper()
		// The script names /cache; run it on a copy that names cacheDir.
		script := strings.ReplaceAll(NextScript, CacheMount, cacheDir)
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "BENCH_PREV=runs/4", "BENCH_STORE="+store)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("next script: %v\n%s", err, out)
		}
		m, err := ParseMarkers(string(out))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Require(MarkStart, MarkReady); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if m[MarkReady] != time.Unix(1795354244, 256264000) {
			t.Errorf("ready at %v", m[MarkReady])
		}
		return m
	}

	store := t.TempDir()
	if err := os.MkdirAll(filepath.Join(store, "runs", "4"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(store, "runs", "4", "output.bin"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m := run(t, t.TempDir(), store); !has(m, MarkWarm) || has(m, MarkStale) {
		t.Errorf("copied in from the store: markers %v, want warm", m)
	}
	if m := run(t, t.TempDir(), t.TempDir()); has(m, MarkWarm) || !has(m, MarkStale) {
		t.Errorf("empty store: markers %v, want stale", m)
	}
	// layercache: no store, the volume is the cache.
	if m := run(t, store, ""); !has(m, MarkWarm) {
		t.Errorf("warm volume: markers %v, want warm", m)
	}
}

func has(m Markers, name string) bool { _, ok := m[name]; return ok }
