package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const output = `goos: linux
BenchmarkMountLargeVsEmptyCache-2   	       1	  1234 ns/op	  812.0 empty-µs	  900.0 50k-files-µs	  1.108 large/empty
BenchmarkReadThroughChain-2         	       1	  1234 ns/op	  0.7000 chain/direct-throughput
BenchmarkDeltaReachesOtherNode-2    	       1	  1234 ns/op	  2.500 delta-s
BenchmarkHandoffAcrossNodes-2       	       1	  1234 ns/op	  1.200 handoff/publish-64MiB
PASS
`

func TestVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name, targets string
		wantErr       string
		wantOut       []string
	}{
		{"met", "BenchmarkMountLargeVsEmptyCache large/empty <= 1.5 2\n", "", []string{"1.11", "<= 1.5", "ok"}},
		{"missed within margin", "BenchmarkReadThroughChain chain/direct-throughput >= 0.9 1.5\n", "", []string{"0.7", "miss (within the margin)"}},
		{"missed clearly", "BenchmarkDeltaReachesOtherNode delta-s <= 1 2\n", "delta-s = 2.5, target <= 1 (margin 2x)", []string{"FAIL"}},
		{"not reported", "# a comment\nBenchmarkGone x <= 1 2\n", "BenchmarkGone x was not reported", []string{"MISSING"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRun(t, tc.targets, "full", tc.wantErr, tc.wantOut, nil)
		})
	}
}

// checkRun runs benchcheck on output at size with targets and checks its
// error and what it printed.
func checkRun(t *testing.T, targets, size, wantErr string, wantOut, notOut []string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "targets")
	if err := os.WriteFile(file, []byte(targets), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := run(file, size, strings.NewReader(output), &out)
	if (wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), wantErr)) {
		t.Errorf("run: %v, want error containing %q", err, wantErr)
	}
	for _, w := range wantOut {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output %q lacks %q", out.String(), w)
		}
	}
	for _, w := range notOut {
		if strings.Contains(out.String(), w) {
			t.Errorf("output %q has %q", out.String(), w)
		}
	}
}

// The sixth column limits a target to one size: make bench checks the
// full-size ones, make bench-smoke the smoke ones, both the unmarked.
func TestSizes(t *testing.T) {
	const targets = `BenchmarkMountLargeVsEmptyCache large/empty <= 1.5 2
BenchmarkHandoffAcrossNodes handoff/publish-1GiB <= 1.5 1.5 full
BenchmarkHandoffAcrossNodes handoff/publish-64MiB <= 1.5 1.5 smoke
`
	for _, tc := range []struct {
		name, targets, size, wantErr string
		wantOut, notOut              []string
	}{
		{"smoke checks the unmarked and the smoke targets", targets, "smoke", "",
			[]string{"size smoke", "large/empty", "handoff/publish-64MiB", "1.2"}, []string{"1GiB"}},
		{"full fails on its own target's missing metric", targets, "full", "handoff/publish-1GiB was not reported",
			[]string{"large/empty", "MISSING"}, []string{"64MiB"}},
		{"a smoke target fails too when its metric is missing", "BenchmarkCommitMemory commit-10k/1k <= 2 1.5 smoke\n", "smoke",
			"BenchmarkCommitMemory commit-10k/1k was not reported", []string{"MISSING"}, nil},
		{"a missing metric of the other size is no failure", targets[:strings.Index(targets, "\nBenchmarkHandoff")+1] +
			"BenchmarkCommitMemory commit-100k/1k <= 2 1.5 full\n", "smoke", "", []string{"ok"}, []string{"MISSING"}},
		{"no target at the size", "BenchmarkHandoffAcrossNodes handoff/publish-1GiB <= 1.5 1.5 full\n", "smoke",
			"no target applies at size smoke", nil, nil},
		{"an unknown size", targets, "small", `size "small": want one of full, smoke`, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRun(t, tc.targets, tc.size, tc.wantErr, tc.wantOut, tc.notOut)
		})
	}
}

func TestParseTargets(t *testing.T) {
	for _, tc := range []struct {
		line, wantErr, wantSize string
	}{
		{"BenchmarkX m <= 1 2", "", ""},
		{"BenchmarkX m <= 1 2 full", "", "full"},
		{"BenchmarkX m >= 3 1.5 smoke", "", "smoke"},
		{"BenchmarkX m < 1 2", "want BENCHMARK METRIC", ""},
		{"BenchmarkX m <= one 2", "VALUE and MARGIN must be numbers", ""},
		{"BenchmarkX m <= 1 0.5", "MARGIN >= 1", ""},
		{"BenchmarkX m <= 1", "want BENCHMARK METRIC", ""},
		{"BenchmarkX m <= 1 2 Smoke", `size "Smoke": want one of full, smoke`, ""},
		{"BenchmarkX m <= 1 2 full smoke", "want BENCHMARK METRIC", ""},
	} {
		got, err := parseTargets(strings.NewReader(tc.line))
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "line 1")):
			t.Errorf("targets line %q: error %v, want one with line 1 and %q", tc.line, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || len(got) != 1 || got[0].size != tc.wantSize):
			t.Errorf("targets line %q = %+v, %v; want one target of size %q", tc.line, got, err, tc.wantSize)
		}
	}
}
