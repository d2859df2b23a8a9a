package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/layercache/layercache/layerfs"
)

var (
	now   = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	maven = layerfs.CacheRef{Namespace: "ci", Name: "maven"}
	npm   = layerfs.CacheRef{Namespace: "ci", Name: "npm"}
)

// Deliberately out of order: the output is sorted.
var fixtureCaches = []layerfs.CacheInfo{
	{
		Cache:      npm,
		Generation: 0,
	},
	{
		Cache:      maven,
		Generation: 12,
		Layers: []layerfs.LayerInfo{
			{ID: "l3", Bytes: 1536, Files: 3, Created: now.Add(-5 * time.Minute)},
			{ID: "l2", Bytes: 1024, Files: 1, Created: now.Add(-10 * time.Minute), Digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
			{ID: "l1", Bytes: 3 << 30, Files: 70000, Created: now.Add(-50 * time.Hour), Covers: []string{"sha256:a", "sha256:b"}},
		},
		Bytes:      3<<30 + 2560,
		LastUsed:   now.Add(-5 * time.Minute),
		LastWriter: "ci/build-42",
		Volumes:    []string{"build-43", "build-44"},
	},
}

var fixtureVolumes = []layerfs.Volume{
	{ID: "pr-7", Cache: maven, ReadOnly: true, BaseGeneration: 12, Layers: []string{"l3", "l1"}, MergedPath: "/var/lib/layercache/volumes/pr-7/merged", Mounted: false},
	{ID: "build-43", Cache: maven, Writer: "ci/build-43", BaseGeneration: 11, Layers: []string{"l1"}, MergedPath: "/var/lib/layercache/volumes/build-43/merged", Mounted: true},
}

func TestWriteCaches(t *testing.T) {
	tests := []struct {
		format string
		caches []layerfs.CacheInfo
		want   string
	}{
		{
			format: outputTable,
			caches: fixtureCaches,
			want: `CACHE      GENERATION   LAYERS   SIZE     LAST USED   VOLUMES
ci/maven   12           3        3.0GiB   5m ago      2
ci/npm     0            0        0B       never       0
`,
		},
		{format: outputTable, want: "CACHE   GENERATION   LAYERS   SIZE   LAST USED   VOLUMES\n"},
		{format: outputName, caches: fixtureCaches, want: "ci/maven\nci/npm\n"},
		{format: outputName, want: ""},
		{format: outputJSON, want: "[]\n"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeCaches(&b, tt.format, tt.caches, now); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), tt.want)
			}
		})
	}
}

func TestWriteCachesJSONRoundTrips(t *testing.T) {
	var b bytes.Buffer
	if err := writeCaches(&b, outputJSON, fixtureCaches, now); err != nil {
		t.Fatal(err)
	}
	var got []layerfs.CacheInfo
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, b.String())
	}
	if len(got) != 2 || got[0].Cache != maven || got[0].Generation != 12 || len(got[0].Layers) != 3 || got[1].Cache != npm ||
		got[0].Layers[1].Digest != fixtureCaches[1].Layers[1].Digest || len(got[0].Layers[2].Covers) != 2 {
		t.Errorf("round trip gave %+v", got)
	}
	if !strings.Contains(b.String(), `"cache": "ci/maven"`) {
		t.Errorf("cache should print as NAMESPACE/NAME:\n%s", b.String())
	}
}

func TestWriteVolumes(t *testing.T) {
	tests := []struct {
		format string
		want   string
	}{
		{
			format: outputTable,
			want: `VOLUME     CACHE      BASE   MOUNTED   PATH
build-43   ci/maven   11     yes       /var/lib/layercache/volumes/build-43/merged
pr-7       ci/maven   12     no        /var/lib/layercache/volumes/pr-7/merged
`,
		},
		{format: outputName, want: "build-43\npr-7\n"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeVolumes(&b, tt.format, fixtureVolumes); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), tt.want)
			}
		})
	}
	var b bytes.Buffer
	if err := writeVolumes(&b, outputJSON, nil); err != nil || b.String() != "[]\n" {
		t.Errorf("no volumes as JSON: %q, %v", b.String(), err)
	}
}

func TestWriteCacheInfo(t *testing.T) {
	tests := []struct {
		name string
		info layerfs.CacheInfo
		want string
	}{
		{
			name: "layers",
			info: fixtureCaches[1],
			want: `Cache:         ci/maven
Generation:    12
Layers:        3
Size:          3.0GiB (3221228032 bytes)
Last used:     2026-05-01T11:55:00Z (5m ago)
Last writer:   ci/build-42
Volumes:       build-43, build-44

LAYER   SIZE     FILES   CREATED    PUBLISHED
l3      1.5KiB   3       5m ago     -
l2      1.0KiB   1       10m ago    sha256:0123456789ab
l1      3.0GiB   70000   2d2h ago   squash of 2
`,
		},
		{
			name: "empty",
			info: fixtureCaches[0],
			want: `Cache:         ci/npm
Generation:    0
Layers:        0
Size:          0B (0 bytes)
Last used:     never
Last writer:   -
Volumes:       -
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeCacheInfo(&b, outputTable, tt.info, fixtureCaches, now); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), tt.want)
			}
		})
	}
}

func TestWriteVolumeDetails(t *testing.T) {
	d := volumeDetails{
		Volume:       fixtureVolumes[0],
		MountCommand: "mount -t overlay overlay -o lowerdir=l3:l1,upperdir=u,workdir=w /m",
	}
	d.Created = now
	var b bytes.Buffer
	if err := writeVolumeDetails(&b, outputTable, d); err != nil {
		t.Fatal(err)
	}
	want := `Volume:            pr-7
Cache:             ci/maven
Mode:              read-only
Writer:            -
Base generation:   12
Created:           2026-05-01T12:00:00Z
Merged path:       /var/lib/layercache/volumes/pr-7/merged
Mounted:           no
Lower layers:      2 (newest first)
                   l3
                   l1

Mount command:
  mount -t overlay overlay -o lowerdir=l3:l1,upperdir=u,workdir=w /m
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	// A torn volume says so, right after whether it is mounted.
	d.Torn = true
	b.Reset()
	if err := writeVolumeDetails(&b, outputTable, d); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Mounted:           no\nTorn:              yes: the node went down while it was mounted") {
		t.Errorf("torn volume details lack the torn line:\n%s", b.String())
	}

	b.Reset()
	if err := writeVolumeDetails(&b, outputJSON, d); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, b.String())
	}
	if got["id"] != "pr-7" || got["cache"] != "ci/maven" || got["mountCommand"] != d.MountCommand {
		t.Errorf("JSON should inline the volume and add mountCommand:\n%s", b.String())
	}
}

func TestReportCommit(t *testing.T) {
	tests := []struct {
		name       string
		res        layerfs.CommitResult
		wantStdout string
		wantStderr string
	}{
		{name: "new layer", res: layerfs.CommitResult{Cache: maven, Generation: 13, Layer: "l4", Bytes: 10}, wantStdout: "13\n"},
		{
			name:       "no changes",
			res:        layerfs.CommitResult{Cache: maven, Generation: 12},
			wantStdout: "12\n",
			wantStderr: "layerfs: volume build-43 had no changes; cache ci/maven stays at generation 12\n",
		},
		{
			name:       "dropped",
			res:        layerfs.CommitResult{Cache: maven, Dropped: true},
			wantStdout: "0\n",
			wantStderr: "layerfs: cache ci/maven was removed while volume build-43 was in use; its changes were dropped\n",
		},
		{
			name:       "torn by a crash",
			res:        layerfs.CommitResult{Cache: maven, Generation: 12, Torn: true},
			wantStdout: "12\n",
			wantStderr: "layerfs: volume build-43 was mounted when the node went down, so its changes may be torn; it was discarded and cache ci/maven stays at generation 12\n",
		},
		{
			name:       "seeded",
			res:        layerfs.CommitResult{Cache: maven, Generation: 1, Layer: "l1", SeededFrom: &layerfs.Seed{Cache: layerfs.CacheRef{Namespace: "ci", Name: "main"}, Generation: 7}},
			wantStdout: "1\n",
			wantStderr: "layerfs: cache ci/maven was created on the layers of fallback ci/main@7, shared with it\n",
		},
		{
			name:       "needs squash",
			res:        layerfs.CommitResult{Cache: maven, Generation: 40, Layer: "l40", NeedsSquash: true},
			wantStdout: "40\n",
			wantStderr: "layerfs: cache ci/maven has more layers than the squash limit; run 'layerfs squash ci/maven'\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if err := reportCommit(&stdout, &stderr, "build-43", tt.res); err != nil {
				t.Fatal(err)
			}
			if stdout.String() != tt.wantStdout || stderr.String() != tt.wantStderr {
				t.Errorf("stdout %q stderr %q, want %q %q", stdout.String(), stderr.String(), tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

func TestSummaries(t *testing.T) {
	tests := []struct {
		name  string
		write func(*bytes.Buffer) error
		want  string
	}{
		{
			name: "squashed",
			write: func(b *bytes.Buffer) error {
				return writeSquashResult(b, maven, 32, layerfs.SquashResult{Squashed: true, Layer: "l9", OldLayers: 33, Entries: 1200})
			},
			want: "squashed ci/maven: 33 layers into layer l9 (1200 entries)\n",
		},
		{
			name: "not squashed, limit one",
			write: func(b *bytes.Buffer) error {
				return writeSquashResult(b, maven, 1, layerfs.SquashResult{})
			},
			want: "nothing to squash: ci/maven has at most 1 layer\n",
		},
		{
			name: "not squashed",
			write: func(b *bytes.Buffer) error {
				return writeSquashResult(b, maven, 32, layerfs.SquashResult{})
			},
			want: "nothing to squash: ci/maven has at most 32 layers\n",
		},
		{
			name: "gc removed",
			write: func(b *bytes.Buffer) error {
				return writeGCResult(b, layerfs.GCResult{RemovedCaches: []layerfs.CacheRef{maven, npm}, RemovedLayers: 5, FreedBytes: 3 << 20})
			},
			want: "gc: removed 2 caches (ci/maven, ci/npm) and 5 layers, freed 3.0MiB\n",
		},
		{
			name: "gc layers only",
			write: func(b *bytes.Buffer) error {
				return writeGCResult(b, layerfs.GCResult{RemovedLayers: 1, FreedBytes: 10})
			},
			want: "gc: removed 1 layer, freed 10B\n",
		},
		{
			name: "gc one cache",
			write: func(b *bytes.Buffer) error {
				return writeGCResult(b, layerfs.GCResult{RemovedCaches: []layerfs.CacheRef{npm}, FreedBytes: 2048})
			},
			want: "gc: removed 1 cache (ci/npm), freed 2.0KiB\n",
		},
		{
			name:  "gc nothing",
			write: func(b *bytes.Buffer) error { return writeGCResult(b, layerfs.GCResult{}) },
			want:  "gc: nothing to remove\n",
		},
		{
			name: "recover repaired",
			write: func(b *bytes.Buffer) error {
				return writeRecoverResult(b, layerfs.RecoverResult{Remounted: []string{"a", "b"}, RemovedTemp: 2, RemovedLayers: 1})
			},
			want: "remounted volume a\nremounted volume b\nremoved 2 leftovers of interrupted operations\nremoved 1 unreferenced layer\n",
		},
		{
			name:  "recover nothing",
			write: func(b *bytes.Buffer) error { return writeRecoverResult(b, layerfs.RecoverResult{}) },
			want:  "recover: nothing to repair\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tt.write(&b); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Errorf("got %q, want %q", b.String(), tt.want)
			}
		})
	}
}

func TestFormatAge(t *testing.T) {
	tests := []struct {
		t    time.Time
		want string
	}{
		{time.Time{}, "never"},
		{now, "0s ago"},
		{now.Add(time.Minute), "0s ago"}, // another node's clock ahead of ours
		{now.Add(-90 * time.Second), "90s ago"},
		{now.Add(-3 * time.Hour), "3h ago"},
		{now.Add(-40 * 24 * time.Hour), "40d ago"},
	}
	for _, tt := range tests {
		if got := formatAge(tt.t, now); got != tt.want {
			t.Errorf("formatAge(%v) = %q, want %q", tt.t, got, tt.want)
		}
	}
}

func TestProgress(t *testing.T) {
	tests := []struct {
		in   layerfs.Progress
		want string
	}{
		{layerfs.Progress{Op: "squash", Cache: "ci/maven", Done: 250, Total: 1000}, "squash ci/maven: 250/1000 entries (25%)"},
		{layerfs.Progress{Op: "squash", Cache: "ci/maven", Done: 7}, "squash ci/maven: 7 entries"},
		{layerfs.Progress{Op: "gc", Done: 3, Total: 3}, "gc: 3/3 items (100%)"},
	}
	for _, tt := range tests {
		if got := formatProgress(tt.in); got != tt.want {
			t.Errorf("formatProgress(%+v) = %q, want %q", tt.in, got, tt.want)
		}
	}

	// The line is redrawn in place and cleared before the summary; the last
	// report of a known total is always drawn, however soon it comes.
	var b bytes.Buffer
	p := &progressLine{w: &b}
	p.report(layerfs.Progress{Op: "gc", Done: 1, Total: 2})
	p.report(layerfs.Progress{Op: "gc", Done: 2, Total: 2})
	p.finish()
	want := "\rgc: 1/2 items (50%)\x1b[K\rgc: 2/2 items (100%)\x1b[K\r\x1b[K"
	if b.String() != want {
		t.Errorf("progress wrote %q, want %q", b.String(), want)
	}
	b.Reset()
	(&progressLine{w: &b}).finish()
	if b.Len() != 0 {
		t.Errorf("finish without progress wrote %q", b.String())
	}
}

func TestCheckOutput(t *testing.T) {
	if err := checkOutput("json", outputJSON, outputTable); err != nil {
		t.Error(err)
	}
	err := checkOutput("wide", outputJSON, outputTable)
	if err == nil || err.Error() != `invalid output format -o "wide"; use one of: json, table` {
		t.Errorf("checkOutput(wide) = %v", err)
	}
}

// A store with a snapshot cache shows every cache's layout.
func TestWriteCachesLayoutColumn(t *testing.T) {
	caches := []layerfs.CacheInfo{
		{Cache: maven, Generation: 2, Layout: layerfs.LayoutOverlay},
		{Cache: layerfs.CacheRef{Namespace: "ci", Name: "buildkit"}, Generation: 1, Layout: layerfs.LayoutSnapshot},
	}
	var b bytes.Buffer
	if err := writeCaches(&b, outputTable, caches, now); err != nil {
		t.Fatal(err)
	}
	want := `CACHE         GENERATION   LAYERS   SIZE   LAST USED   VOLUMES   LAYOUT
ci/buildkit   1            0        0B     never       0         snapshot
ci/maven      2            0        0B     never       0         overlay
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

// A store with a seeded cache shows what each cache was seeded from and
// how many of each cache's layers another cache's head also names;
// inspect says with which caches each layer is shared.
func TestWriteCachesSeededColumn(t *testing.T) {
	pr1 := layerfs.CacheRef{Namespace: "ci", Name: "pr-1"}
	pr2 := layerfs.CacheRef{Namespace: "ci", Name: "pr-2"}
	caches := []layerfs.CacheInfo{
		{Cache: maven, Generation: 2, Layout: layerfs.LayoutOverlay, Layers: []layerfs.LayerInfo{{ID: "m2"}, {ID: "m1"}}},
		{Cache: pr1, Generation: 1, Layout: layerfs.LayoutOverlay, Layers: []layerfs.LayerInfo{{ID: "p1"}, {ID: "m2"}, {ID: "m1"}},
			SeededFrom: &layerfs.Seed{Cache: maven, Generation: 2}},
		{Cache: pr2, Generation: 1, Layout: layerfs.LayoutOverlay, Layers: []layerfs.LayerInfo{{ID: "p2"}, {ID: "m1"}},
			SeededFrom: &layerfs.Seed{Cache: maven, Generation: 1}},
		{Cache: npm, Generation: 1, Layout: layerfs.LayoutOverlay, Layers: []layerfs.LayerInfo{{ID: "n1"}}},
	}
	var b bytes.Buffer
	if err := writeCaches(&b, outputTable, caches, now); err != nil {
		t.Fatal(err)
	}
	want := `CACHE      GENERATION   LAYERS   SIZE   LAST USED   VOLUMES   SEEDED FROM   SHARED
ci/maven   2            2        0B     never       0         -             2
ci/npm     1            1        0B     never       0         -             0
ci/pr-1    1            3        0B     never       0         ci/maven@2    2
ci/pr-2    1            2        0B     never       0         ci/maven@1    1
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	if err := writeCaches(&b, outputJSON, caches, now); err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Cache        layerfs.CacheRef `json:"cache"`
		SharedLayers int              `json:"sharedLayers"`
	}
	if err := json.Unmarshal(b.Bytes(), &rows); err != nil || len(rows) != 4 || rows[0].SharedLayers != 2 || rows[3].SharedLayers != 1 {
		t.Errorf("ls -o json sharedLayers: %+v, %v\n%s", rows, err, b.String())
	}

	b.Reset()
	if err := writeCacheInfo(&b, outputTable, caches[1], caches, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Seeded from:   ci/maven@2 (its bottom layers may be shared with it)") {
		t.Errorf("inspect output lacks the seed:\n%s", b.String())
	}
	wantLayers := `LAYER   SIZE   FILES   CREATED   PUBLISHED   SHARED WITH
p1      0B     0       never     -           -
m2      0B     0       never     -           ci/maven
m1      0B     0       never     -           ci/maven, ci/pr-2
`
	if !strings.HasSuffix(b.String(), wantLayers) {
		t.Errorf("inspect layers:\n%s\nwant them to end with:\n%s", b.String(), wantLayers)
	}

	b.Reset()
	if err := writeCacheInfo(&b, outputJSON, caches[1], caches, now); err != nil {
		t.Fatal(err)
	}
	var details struct {
		SharedWith map[string][]layerfs.CacheRef `json:"sharedWith"`
	}
	if err := json.Unmarshal(b.Bytes(), &details); err != nil || len(details.SharedWith) != 2 || len(details.SharedWith["m1"]) != 2 {
		t.Errorf("inspect -o json sharedWith: %+v, %v\n%s", details.SharedWith, err, b.String())
	}
}
