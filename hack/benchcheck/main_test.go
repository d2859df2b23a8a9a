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
			file := filepath.Join(t.TempDir(), "targets")
			if err := os.WriteFile(file, []byte(tc.targets), 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err := run(file, strings.NewReader(output), &out)
			if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("run: %v, want error containing %q", err, tc.wantErr)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output %q lacks %q", out.String(), w)
				}
			}
		})
	}
}

func TestBadTargets(t *testing.T) {
	for _, line := range []string{"BenchmarkX m < 1 2", "BenchmarkX m <= one 2", "BenchmarkX m <= 1 0.5", "BenchmarkX m <= 1"} {
		if _, err := parseTargets(strings.NewReader(line)); err == nil {
			t.Errorf("targets line %q was accepted", line)
		}
	}
}
