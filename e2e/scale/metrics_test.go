//go:build scale

package scale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// sample is one series of a Prometheus text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics is a scrape of a /metrics endpoint.
type metrics []sample

// parseMetrics reads the Prometheus text format: enough of it for the
// counters and gauges the scale test reads (no exemplars or timestamps).
func parseMetrics(b []byte) (metrics, error) {
	var out metrics
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := cutLast(line, ' ')
		if !ok {
			return nil, fmt.Errorf("metrics line %q has no value", line)
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		smp := sample{name: series, labels: map[string]string{}, value: v}
		if name, rest, ok := strings.Cut(series, "{"); ok {
			smp.name = name
			if smp.labels, err = parseLabels(strings.TrimSuffix(rest, "}")); err != nil {
				return nil, fmt.Errorf("metrics line %q: %w", line, err)
			}
		}
		out = append(out, smp)
	}
	return out, s.Err()
}

func cutLast(s string, sep byte) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, sep)
	if i < 0 {
		return s, "", false
	}
	return strings.TrimSpace(s[:i]), s[i+1:], true
}

// parseLabels reads k="v",k2="v2" with Go-style escapes in the values.
func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for s = strings.TrimSpace(s); s != ""; {
		key, rest, ok := strings.Cut(s, "=")
		if !ok || !strings.HasPrefix(rest, `"`) {
			return nil, fmt.Errorf("bad labels at %q", s)
		}
		// The value ends at the first unescaped quote.
		end := 1
		for ; end < len(rest); end++ {
			if rest[end] == '\\' {
				end++
				continue
			}
			if rest[end] == '"' {
				break
			}
		}
		if end >= len(rest) {
			return nil, fmt.Errorf("unterminated label value at %q", s)
		}
		v, err := strconv.Unquote(rest[:end+1])
		if err != nil {
			return nil, fmt.Errorf("label %s: %w", key, err)
		}
		labels[strings.TrimSpace(key)] = v
		s = strings.TrimPrefix(strings.TrimSpace(rest[end+1:]), ",")
		s = strings.TrimSpace(s)
	}
	return labels, nil
}

// sum adds up the series of name for which keep holds (nil keeps all).
func (m metrics) sum(name string, keep func(map[string]string) bool) float64 {
	var total float64
	for _, s := range m {
		if s.name == name && (keep == nil || keep(s.labels)) {
			total += s.value
		}
	}
	return total
}

// by adds up the series of name for which keep holds, per value of label.
func (m metrics) by(name, label string, keep func(map[string]string) bool) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m {
		if s.name == name && (keep == nil || keep(s.labels)) {
			out[s.labels[label]] += s.value
		}
	}
	return out
}

// isWrite keeps requests that change state: the verbs of apiserver_request_total
// (APPLY is server-side apply) and the methods of rest_client_requests_total.
func isWrite(key string) func(map[string]string) bool {
	return func(l map[string]string) bool {
		switch l[key] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION":
			return true
		}
		return false
	}
}

// scrape GETs a plain-HTTP /metrics endpoint (the manager's, the agent's).
func scrape(ctx context.Context, url string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	return parseMetrics(b)
}

// delta is after minus before per key, over minutes, as a rate per minute.
func perMinute(before, after map[string]float64, minutes float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d / minutes
		}
	}
	return out
}
