package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Markers the workload script prints, "BENCH <name> <unix seconds>".
const (
	// MarkStart: the container runs.
	MarkStart = "start"
	// MarkReady: the cache is warm in the volume; the build step can start.
	MarkReady = "ready"
	// MarkBuilt: the build step is done.
	MarkBuilt = "built"
	// MarkCopied: local-path only, the changes are copied back to the store.
	MarkCopied = "copied"
	// MarkCommitted: local-path only, the copy is synced to disk.
	MarkCommitted = "committed"
	// MarkWarm: the next pod's cache holds the build pod's output (for
	// local-path after copying it in).
	MarkWarm = "warm"
	// MarkStale: the next pod's cache lacks the build pod's output.
	MarkStale = "stale"
)

// Markers maps marker names to the times the script printed them.
type Markers map[string]time.Time

// ParseMarkers reads the markers in a build pod's log. Other lines are
// ignored; a marker that appears twice or has a malformed time is an error,
// because the time it stands for would be ambiguous.
func ParseMarkers(log string) (Markers, error) {
	m := Markers{}
	for line := range strings.Lines(log) {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "BENCH" {
			continue
		}
		if len(fields) != 3 {
			return nil, fmt.Errorf("malformed marker line %q: want \"BENCH <name> <unix seconds>\"", strings.TrimSpace(line))
		}
		name := fields[1]
		t, err := parseUnix(fields[2])
		if err != nil {
			return nil, fmt.Errorf("marker %s: %w", name, err)
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("marker %s appears twice in the log; did the container restart?", name)
		}
		m[name] = t
	}
	return m, nil
}

// Require returns an error naming the markers that are missing.
func (m Markers) Require(names ...string) error {
	var missing []string
	for _, n := range names {
		if _, ok := m[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the log lacks the markers %s (has %d markers); the script ended early or its output changed", strings.Join(missing, ", "), len(m))
	}
	return nil
}

// parseUnix parses seconds since the epoch with up to nine fractional
// digits, as ts %.s prints them (e.g. 1795354244.256264), exactly: a
// float64 would round away the microseconds.
func parseUnix(s string) (time.Time, error) {
	secStr, fracStr, hasFrac := strings.Cut(s, ".")
	if !digits(secStr) || (hasFrac && !digits(fracStr)) {
		return time.Time{}, fmt.Errorf("time %q is not unix seconds", s)
	}
	if len(fracStr) > 9 {
		return time.Time{}, fmt.Errorf("time %q has more than nine fractional digits", s)
	}
	sec, err := strconv.ParseInt(secStr, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q: %w", s, err)
	}
	var nsec int64
	for i := range 9 {
		nsec *= 10
		if i < len(fracStr) {
			nsec += int64(fracStr[i] - '0')
		}
	}
	return time.Unix(sec, nsec), nil
}

// digits reports whether s is a non-empty string of ASCII digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// ParseSeedFiles reads the file count that SeedScript prints.
func ParseSeedFiles(log string) (int, error) {
	for line := range strings.Lines(log) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "BENCH-SEED files=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return 0, fmt.Errorf("malformed seed line %q", strings.TrimSpace(line))
		}
		return n, nil
	}
	return 0, fmt.Errorf("the seed pod's log has no \"BENCH-SEED files=N\" line; the seed script did not finish")
}
