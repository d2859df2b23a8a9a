package bench

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// RequestsMetric is the client-side counter of API requests that
// controller-runtime registers for every client-go client of a process,
// labelled code, host and method. Both of layercache's binaries serve it.
const RequestsMetric = "rest_client_requests_total"

// WriteMethods are the HTTP methods that change objects. Server-side
// apply is a PATCH, an Event is a POST (or a PATCH when the recorder
// counts a repeat), a lease renewal a PUT.
var WriteMethods = []string{"POST", "PUT", "PATCH", "DELETE"}

// Components are the layercache processes whose writes are counted: the
// node agent of the benchmark's node and the manager (every replica).
const (
	ComponentNode    = "node agent"
	ComponentManager = "manager"
)

// Components in the order the results list them.
var Components = []string{ComponentNode, ComponentManager}

// Counter is one series of a Prometheus counter: its labels and value.
type Counter struct {
	Labels map[string]string
	Value  float64
}

// ParseCounters reads the series of metric name from a Prometheus text
// exposition (format 0.0.4, what controller-runtime's /metrics serves).
// Other metrics, comments and blank lines are skipped; a malformed line of
// the metric is an error, since a count read wrong would go unnoticed.
func ParseCounters(text, name string) ([]Counter, error) {
	var out []Counter
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ' && rest[0] != '\t') {
			continue // another metric, perhaps one whose name starts with name
		}
		labels := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			var err error
			labels, rest, err = parseLabels(rest[1:])
			if err != nil {
				return nil, fmt.Errorf("metric line %q: %w", line, err)
			}
		}
		fields := strings.Fields(rest)
		if len(fields) < 1 || len(fields) > 2 {
			return nil, fmt.Errorf("metric line %q: want a value and an optional timestamp after the labels", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: value: %w", line, err)
		}
		out = append(out, Counter{Labels: labels, Value: v})
	}
	return out, nil
}

// parseLabels reads `a="x",b="y"}` (the opening brace already consumed)
// and returns the labels and what follows the closing brace.
func parseLabels(s string) (map[string]string, string, error) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, "", errors.New("malformed labels")
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return nil, "", fmt.Errorf("label %s: value is not quoted", key)
		}
		var val strings.Builder
		i, closed := 1, false
		for ; i < len(s); i++ {
			c := s[i]
			if c == '"' {
				closed = true
				break
			}
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default: // \\ and \"
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(c)
		}
		if !closed {
			return nil, "", fmt.Errorf("label %s: unterminated value", key)
		}
		labels[key] = val.String()
		s = strings.TrimLeft(s[i+1:], " \t")
		if strings.HasPrefix(s, ",") {
			s = s[1:]
		} else if !strings.HasPrefix(s, "}") {
			return nil, "", fmt.Errorf("label %s: want , or } after the value", key)
		}
	}
}

// Requests counts one process's API requests by method and status code.
type Requests map[RequestKey]float64

// RequestKey is a method and a status code, e.g. PATCH 200.
type RequestKey struct {
	Method string
	Code   string
}

// ParseRequests reads RequestsMetric from a /metrics page, summed over
// hosts.
func ParseRequests(text string) (Requests, error) {
	counters, err := ParseCounters(text, RequestsMetric)
	if err != nil {
		return nil, err
	}
	if len(counters) == 0 {
		return nil, fmt.Errorf("the metrics have no %s; does the process use controller-runtime's metrics registry?", RequestsMetric)
	}
	r := Requests{}
	for _, c := range counters {
		r[RequestKey{Method: c.Labels["method"], Code: c.Labels["code"]}] += c.Value
	}
	return r, nil
}

// Sub returns the requests made between the snapshots before and r. A
// counter that went down means the process restarted in between, and the
// difference is unknown.
func (r Requests) Sub(before Requests) (Requests, error) {
	d := Requests{}
	for k, v := range r {
		if v < before[k] {
			return nil, fmt.Errorf("%s %s went from %g down to %g: the process restarted", k.Method, k.Code, before[k], v)
		}
		if v > before[k] {
			d[k] = v - before[k]
		}
	}
	for k, v := range before {
		if _, ok := r[k]; !ok && v > 0 {
			return nil, fmt.Errorf("%s %s disappeared (was %g): the process restarted", k.Method, k.Code, v)
		}
	}
	return d, nil
}

// Writes sums the write requests by method (WriteMethods), whatever their
// status code; a method without writes counts 0.
func (r Requests) Writes() map[string]float64 {
	w := map[string]float64{}
	for _, m := range WriteMethods {
		w[m] = 0
	}
	for k, v := range r {
		if _, ok := w[k.Method]; ok {
			w[k.Method] += v
		}
	}
	return w
}

// FailedWrites lists the write requests whose status code is not 2xx,
// e.g. {"PATCH 409": 1}.
func (r Requests) FailedWrites() map[string]float64 {
	f := map[string]float64{}
	for k, v := range r {
		if slices.Contains(WriteMethods, k.Method) && !strings.HasPrefix(k.Code, "2") {
			f[k.Method+" "+k.Code] += v
		}
	}
	return f
}

// WriteWindow is what layercache's processes wrote in one window of the
// benchmark: the run of a layercache build pod and its next pod, or, as
// the background, the run of a local-path pair, which layercache has no
// part in.
type WriteWindow struct {
	Seconds float64 `json:"seconds"`
	// Writes by component, then method.
	Writes map[string]map[string]float64 `json:"writes,omitempty"`
	// Failed writes (non-2xx) by component, then "METHOD CODE".
	Failed map[string]map[string]float64 `json:"failed,omitempty"`
	// Unavailable says, per component, why its count is missing.
	Unavailable map[string]string `json:"unavailable,omitempty"`
}

// NewWriteWindow diffs the snapshots of each component; a component
// missing from either, or whose counters went down, is unavailable.
func NewWriteWindow(seconds float64, before, after map[string]Requests, errs map[string]string) WriteWindow {
	w := WriteWindow{Seconds: seconds, Writes: map[string]map[string]float64{}, Failed: map[string]map[string]float64{}, Unavailable: map[string]string{}}
	for _, c := range Components {
		if e := errs[c]; e != "" {
			w.Unavailable[c] = e
			continue
		}
		b, okb := before[c]
		a, oka := after[c]
		if !okb || !oka {
			w.Unavailable[c] = "not scraped"
			continue
		}
		d, err := a.Sub(b)
		if err != nil {
			w.Unavailable[c] = err.Error()
			continue
		}
		w.Writes[c] = d.Writes()
		if f := d.FailedWrites(); len(f) > 0 {
			w.Failed[c] = f
		}
	}
	return w
}

// PodsPerRun is how many pods a run completes: the build pod and the next
// pod that names its cache.
const PodsPerRun = 2

// WriteRow is one line of the writes table: a component's writes of one
// method in one case.
type WriteRow struct {
	Case      string `json:"case"`
	CaseTitle string `json:"caseTitle"`
	Component string `json:"component"`
	Method    string `json:"method"`
	// PerRun: layercache's writes during a layercache run (PodsPerRun
	// completed pods), one sample per run.
	PerRun CountStat `json:"perRun"`
	// Background: its writes during a local-path run, per second.
	BackgroundPerSecond CountStat `json:"backgroundPerSecond"`
	// NetPerPod is the median over layercache runs of (writes minus the
	// median background rate times the run's length), divided by
	// PodsPerRun.
	NetPerPod float64 `json:"netPerPod"`
}

// SummarizeWrites computes the writes table from the samples' windows.
// Runs whose component is unavailable are left out; a component without
// any layercache run is reported in the returned notes instead of a row.
func SummarizeWrites(cases []Case, samples []Sample) ([]WriteRow, []string) {
	var rows []WriteRow
	var notes []string
	for _, c := range cases {
		for _, comp := range Components {
			var lcWindows, bgWindows []WriteWindow
			var why []string
			for _, s := range samples {
				if s.Case != c.Name || s.Writes == nil {
					continue
				}
				if u := s.Writes.Unavailable[comp]; u != "" {
					if s.System == Layercache {
						why = append(why, fmt.Sprintf("run %d: %s", s.Run, u))
					}
					continue
				}
				if _, ok := s.Writes.Writes[comp]; !ok {
					continue
				}
				if s.System == Layercache {
					lcWindows = append(lcWindows, *s.Writes)
				} else {
					bgWindows = append(bgWindows, *s.Writes)
				}
			}
			if len(why) > 0 {
				notes = append(notes, fmt.Sprintf("%s, %s: writes not counted in %d runs (%s)", c.Title, comp, len(why), strings.Join(why, "; ")))
			}
			if len(lcWindows) == 0 {
				notes = append(notes, fmt.Sprintf("%s, %s: no writes counted; its metrics could not be read", c.Title, comp))
				continue
			}
			for _, m := range WriteMethods {
				var perRun, bg []float64
				for _, w := range bgWindows {
					if w.Seconds > 0 {
						bg = append(bg, w.Writes[comp][m]/w.Seconds)
					}
				}
				bgStat := newCountStat(bg)
				var net []float64
				for _, w := range lcWindows {
					v := w.Writes[comp][m]
					perRun = append(perRun, v)
					net = append(net, v-bgStat.Median*w.Seconds)
				}
				runStat := newCountStat(perRun)
				netMedian, _ := Median(net)
				rows = append(rows, WriteRow{
					Case: c.Name, CaseTitle: c.Title, Component: comp, Method: m,
					PerRun: runStat, BackgroundPerSecond: bgStat, NetPerPod: netMedian / PodsPerRun,
				})
			}
		}
	}
	return rows, notes
}

// WriteWritesTable writes the rows as an aligned table.
func WriteWritesTable(w io.Writer, rows []WriteRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "case\tcomponent\tmethod\tper layercache run (%d pods)\tfewest in a run\tbackground per s\tnet per pod\n", PodsPerRun)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t%g\t%.2f\t%.1f\n", r.CaseTitle, r.Component, r.Method,
			r.PerRun.Median, slices.Min(r.PerRun.Samples), r.BackgroundPerSecond.Median, r.NetPerPod)
	}
	return tw.Flush()
}

// CountStat is the median of counts and the counts.
type CountStat struct {
	Median  float64   `json:"median"`
	Samples []float64 `json:"samples"`
}

// newCountStat: the zero median for no samples.
func newCountStat(xs []float64) CountStat {
	m, err := Median(xs)
	if err != nil {
		m = 0
	}
	return CountStat{Median: m, Samples: xs}
}

// FailedWriteNotes sums the failed writes of layercache's runs per case
// and component, e.g. "empty cache, node agent: PATCH 409 ×2".
func FailedWriteNotes(cases []Case, samples []Sample) []string {
	var notes []string
	for _, c := range cases {
		for _, comp := range Components {
			sum := map[string]float64{}
			for _, s := range samples {
				if s.Case == c.Name && s.System == Layercache && s.Writes != nil {
					for k, v := range s.Writes.Failed[comp] {
						sum[k] += v
					}
				}
			}
			if len(sum) == 0 {
				continue
			}
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(sum)) {
				parts = append(parts, fmt.Sprintf("%s ×%g", k, sum[k]))
			}
			notes = append(notes, fmt.Sprintf("%s, %s: failed writes in all layercache runs: %s", c.Title, comp, strings.Join(parts, ", ")))
		}
	}
	return notes
}
