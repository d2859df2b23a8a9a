package bench

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/layercache/layercache/api/v1alpha1"
)

// Bounds of the waits. Every wait is also bounded by the test's context.
const (
	// SeedTimeout bounds writing a seed into a cache and committing it.
	SeedTimeout = 15 * time.Minute
	// RunTimeout bounds one build pod from submission to its end.
	RunTimeout = 10 * time.Minute
	// CommitTimeout bounds layercache's commit after the build pod ended.
	CommitTimeout = 5 * time.Minute
	// CleanupTimeout bounds removing a run's pod and volume.
	CleanupTimeout = 5 * time.Minute
)

// maxRuns keeps the shared cache of the big case shallow: the seed and one
// layer per run stay within layerfs.DefaultMaxLayers (32), so no background
// squash of the 1 GiB cache overlaps the runs being measured.
const maxRuns = 30

// seedDirs is how many directories a seed spreads its files over.
const seedDirs = 50

// Options configure the benchmark; OptionsFromEnv reads them from the
// BENCH_* variables that run.sh passes through.
type Options struct {
	// Runs is how many build pods each system runs per case (BENCH_RUNS).
	Runs int
	// BigFiles and BigBytes size the seeded cache of the big case
	// (BENCH_BIG_FILES, BENCH_BIG_BYTES).
	BigFiles int
	BigBytes int64
	// Node is the node the pods run on (BENCH_NODE); empty means the
	// cluster's first node.
	Node string
	// Output is the directory for results.json and results.txt
	// (BENCH_OUTPUT).
	Output string
}

// DefaultOptions are the settings of `make bench-e2e`.
func DefaultOptions() Options {
	return Options{
		Runs:     5,
		BigFiles: 50_000,
		BigBytes: 1 << 30,
		// go test runs in the package directory, e2e/bench.
		Output: filepath.Join("..", "..", "_output", "bench"),
	}
}

// OptionsFromEnv returns DefaultOptions with the BENCH_* variables that
// lookup finds applied, validated.
func OptionsFromEnv(lookup func(string) (string, bool)) (Options, error) {
	o := DefaultOptions()
	var errs []error
	if v, ok := lookup("BENCH_RUNS"); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("BENCH_RUNS=%q is not a number: set it to the runs per system and case, e.g. 5", v))
		}
		o.Runs = n
	}
	if v, ok := lookup("BENCH_BIG_FILES"); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("BENCH_BIG_FILES=%q is not a number: set it to the file count of the big cache, e.g. 50000", v))
		}
		o.BigFiles = n
	}
	if v, ok := lookup("BENCH_BIG_BYTES"); ok {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("BENCH_BIG_BYTES=%q is not a size: set it to the size of the big cache, e.g. 1Gi", v))
		}
		o.BigBytes = q.Value()
	}
	if v, ok := lookup("BENCH_NODE"); ok {
		o.Node = v
	}
	if v, ok := lookup("BENCH_OUTPUT"); ok && v != "" {
		o.Output = v
	}
	if len(errs) > 0 {
		return o, errors.Join(errs...)
	}
	return o, o.Validate()
}

// Validate reports every setting that cannot work.
func (o Options) Validate() error {
	var errs []error
	if o.Runs < 1 || o.Runs > maxRuns {
		errs = append(errs, fmt.Errorf("BENCH_RUNS=%d is out of range: use 1 to %d (more runs would make layercache squash the shared cache during the benchmark)", o.Runs, maxRuns))
	}
	if _, err := NewSeed(o.BigFiles, o.BigBytes); err != nil {
		errs = append(errs, err)
	}
	if o.Output == "" {
		errs = append(errs, fmt.Errorf("BENCH_OUTPUT is empty: set it to the directory for the results, e.g. _output/bench"))
	}
	return errors.Join(errs...)
}

// Cases are the caches the benchmark measures: an empty one and the big
// seeded one.
func (o Options) Cases() ([]Case, error) {
	seed, err := NewSeed(o.BigFiles, o.BigBytes)
	if err != nil {
		return nil, err
	}
	return []Case{
		{Name: "empty", Title: "empty cache"},
		{Name: "big", Title: fmt.Sprintf("%s in %d files", v1alpha1.FormatSize(seed.Bytes), seed.Files), Seed: seed},
	}, nil
}
