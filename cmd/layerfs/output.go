package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/layercache/layercache/layerfs"
)

// Output formats of -o.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputName  = "name"
)

// checkOutput refuses an -o value the command cannot print, naming the ones
// it can; commands call it before touching the store.
func checkOutput(value string, valid ...string) error {
	if slices.Contains(valid, value) {
		return nil
	}
	return fmt.Errorf("invalid output format -o %q; use one of: %s", value, strings.Join(valid, ", "))
}

func writeJSON(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode JSON output: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", data)
	return err
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
}

// formatAge prints how long ago t was, the way kubectl prints ages.
func formatAge(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return duration.HumanDuration(max(now.Sub(t), 0)) + " ago"
}

// formatTime prints a timestamp for inspect: exact, and relative to now.
func formatTime(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return fmt.Sprintf("%s (%s)", t.UTC().Format(time.RFC3339), formatAge(t, now))
}

// count prints n and the noun, in the plural unless n is one.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// isTerminal tells whether w is a terminal, where redrawn progress lines
// make sense; in a pipe or a log they would be noise.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressInterval bounds how often the progress line is redrawn; the store
// may report every file of a squash.
const progressInterval = 100 * time.Millisecond

// progressLine draws the store's progress reports as one line that is
// redrawn in place. The store may report from several goroutines.
type progressLine struct {
	w       io.Writer
	mu      sync.Mutex
	last    time.Time
	written bool
}

func (p *progressLine) report(pr layerfs.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.written && now.Sub(p.last) < progressInterval && (pr.Total == 0 || pr.Done < pr.Total) {
		return
	}
	p.last, p.written = now, true
	// \x1b[K clears what a longer previous line left behind.
	fmt.Fprintf(p.w, "\r%s\x1b[K", formatProgress(pr))
}

// finish clears the progress line so that the summary starts on a clean line.
func (p *progressLine) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.written {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.written = false
	}
}

func formatProgress(pr layerfs.Progress) string {
	unit := "items"
	if pr.Op == "squash" {
		unit = "entries"
	}
	what := pr.Op
	if pr.Cache != "" {
		what += " " + pr.Cache
	}
	if pr.Total <= 0 {
		return fmt.Sprintf("%s: %d %s", what, pr.Done, unit)
	}
	return fmt.Sprintf("%s: %d/%d %s (%d%%)", what, pr.Done, pr.Total, unit, pr.Done*100/pr.Total)
}

// openWithProgress opens the store and, when errOut is a terminal, shows
// its progress reports there. The returned function clears the progress line
// and must be called before the summary is printed.
func (g *globalOptions) openWithProgress(ctx context.Context, errOut io.Writer) (*layerfs.Store, func(), error) {
	var progress func(layerfs.Progress)
	finish := func() {}
	if isTerminal(errOut) {
		line := &progressLine{w: errOut}
		progress, finish = line.report, line.finish
	}
	store, err := g.open(ctx, progress)
	if err != nil {
		return nil, nil, err
	}
	return store, finish, nil
}
