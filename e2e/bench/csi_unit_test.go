package bench

import (
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/layercache/layercache/api/v1alpha1"
)

func TestVariantOrder(t *testing.T) {
	for _, g := range Groups {
		vs := GroupVariants[g]
		// Twice round: each variant goes first twice.
		runs := 2 * len(vs)
		first := map[Variant]int{}
		for run := range runs {
			got := VariantOrder(vs, run)
			if len(got) != len(vs) || !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(vs))) {
				t.Fatalf("VariantOrder(%v, %d) = %v", vs, run, got)
			}
			first[got[0]]++
		}
		for _, v := range vs {
			if first[v] != 2 {
				t.Errorf("%s: variant %s goes first in %d of %d runs, want 2", g, v, first[v], runs)
			}
		}
	}
}

// TestEveryVariantIsDescribed keeps the per-variant facts in step with
// GroupVariants: a title, a cache for layercache's variants (its own in
// each group), the CSI target where the issue sets one.
func TestEveryVariantIsDescribed(t *testing.T) {
	wantTarget := map[Variant]float64{VariantCSI: TargetRatio, VariantCSIRegistry: TargetRatio}
	for _, g := range Groups {
		if GroupTitles[g] == "" {
			t.Errorf("group %s has no title", g)
		}
		caches := map[string]Variant{}
		for i, v := range GroupVariants[g] {
			if VariantTitles[v] == "" {
				t.Errorf("%s, %s: no title", g, v)
			}
			if i == 0 && v.layercache() {
				t.Errorf("%s: the baseline %s is layercache's", g, v)
			}
			if got := v.ratioTarget(); i > 0 && got != wantTarget[v] {
				t.Errorf("%s, %s: ratio target %g, want %g", g, v, got, wantTarget[v])
			}
			if v.layercache() {
				c := csiCache(g, v)
				if other, dup := caches[c]; dup || c == "" {
					t.Errorf("%s, %s: cache %q (also %s's)", g, v, c, other)
				}
				caches[c] = v
			}
		}
	}
}

func TestCSIPods(t *testing.T) {
	for _, run := range []int{-1, 0, 29} {
		for _, v := range GroupVariants[GroupTrivial] {
			p := TrivialPod(v, run, "layercache-node1", run >= 0 && v.layercache(), "layercache-registry")
			checkPod(t, p)
			vol := cacheVolume(t, p)
			switch v {
			case VariantEmptyDir:
				if vol.EmptyDir == nil {
					t.Errorf("pod %s: cache volume %+v, want an emptyDir", p.Name, vol)
				}
			case VariantCSI:
				want := map[string]string{v1alpha1.CSIAttributeCache: csiCacheTrivial}
				if vol.CSI == nil || vol.CSI.Driver != v1alpha1.CSIDriverName || !maps.Equal(vol.CSI.VolumeAttributes, want) {
					t.Errorf("pod %s: cache volume %+v, want a CSI volume of %s with attributes %v", p.Name, vol, v1alpha1.CSIDriverName, want)
				}
			case VariantCSIRegistry:
				// Its own cache: a registry cache refuses a CSI volume
				// without its class, so it cannot be the plain pod's.
				want := map[string]string{v1alpha1.CSIAttributeCache: csiCacheRegistry, v1alpha1.CSIAttributeStorageClass: "layercache-registry"}
				if vol.CSI == nil || vol.CSI.Driver != v1alpha1.CSIDriverName || !maps.Equal(vol.CSI.VolumeAttributes, want) {
					t.Errorf("pod %s: cache volume %+v, want a CSI volume of %s with attributes %v", p.Name, vol, v1alpha1.CSIDriverName, want)
				}
			case VariantClaim:
				e := vol.Ephemeral
				if e == nil || *e.VolumeClaimTemplate.Spec.StorageClassName != v1alpha1.StorageClassName ||
					e.VolumeClaimTemplate.Annotations[v1alpha1.AnnotationCache] != csiCacheClaim {
					t.Errorf("pod %s: cache volume %+v, want a generic ephemeral claim of class %s", p.Name, vol, v1alpha1.StorageClassName)
				}
			}
			if want := run >= 0 && v != VariantEmptyDir; (env(p, "BENCH_EXPECT_WARM") != "") != want {
				t.Errorf("pod %s: BENCH_EXPECT_WARM = %q, want set: %t", p.Name, env(p, "BENCH_EXPECT_WARM"), want)
			}
		}
		for _, v := range GroupVariants[GroupGoBuild] {
			p := GoBuildPod(v, run, "layercache-node1", "/usr/lib/go", "/root/go/pkg/mod/cache/download", "/var/lib/layercache-bench/x")
			checkPod(t, p)
			if sc := p.Spec.SecurityContext; sc == nil || *sc.RunAsUser != goBuildUID || !*sc.RunAsNonRoot {
				t.Errorf("pod %s: security context %+v, want uid %d", p.Name, sc, goBuildUID)
			}
			vol := cacheVolume(t, p)
			if (v == VariantCSI) != (vol.CSI != nil) || (v == VariantHostPath) != (vol.HostPath != nil) {
				t.Errorf("pod %s: cache volume %+v", p.Name, vol)
			}
			if vol.CSI != nil && vol.CSI.VolumeAttributes["cache"] != csiCacheGoBuild {
				t.Errorf("pod %s: CSI cache %v", p.Name, vol.CSI.VolumeAttributes)
			}
			if len(p.Spec.Volumes) != 4 || env(p, "GOCACHE") != CacheMount+"/go-build" {
				t.Errorf("pod %s: volumes %d, GOCACHE %q", p.Name, len(p.Spec.Volumes), env(p, "GOCACHE"))
			}
		}
	}
	if a, b := RunPodName(GroupTrivial, VariantCSI, -1), RunPodName(GroupGoBuild, VariantCSI, -1); a == b || validation.IsDNS1123Label(a) != nil {
		t.Errorf("pod names %s, %s", a, b)
	}
	names := map[string]bool{}
	for _, g := range Groups {
		for _, v := range GroupVariants[g] {
			for _, run := range []int{-1, 0, 29} {
				n := RunPodName(g, v, run)
				if errs := validation.IsDNS1123Label(n); len(errs) > 0 || names[n] {
					t.Errorf("%s, %s, run %d: pod name %q (repeated: %t) %v", g, v, run, n, names[n], errs)
				}
				names[n] = true
			}
		}
	}
}

func TestRegistryCSIPodNeedsItsClass(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("TrivialPod made a registry CSI pod without the registry's StorageClass")
		}
	}()
	TrivialPod(VariantCSIRegistry, 0, "layercache-node1", true, "")
}

func cacheVolume(t *testing.T, p *corev1.Pod) corev1.Volume {
	t.Helper()
	for _, v := range p.Spec.Volumes {
		if v.Name == "cache" {
			for _, m := range p.Spec.Containers[0].VolumeMounts {
				if m.Name == "cache" && m.MountPath == CacheMount {
					return v
				}
			}
		}
	}
	t.Fatalf("pod %s mounts no cache volume at %s", p.Name, CacheMount)
	return corev1.Volume{}
}

// TestCSIScriptMarkers keeps the scripts and the markers csiRun needs in
// step.
func TestCSIScriptMarkers(t *testing.T) {
	for script, marks := range map[string][]string{
		TrivialScript: {MarkStart, MarkBuilt},
		GoBuildScript: {MarkStart, MarkReady, MarkBuilt},
	} {
		last := -1
		for _, m := range marks {
			i := strings.Index(script, "mark "+m+"\n")
			if i < 0 || i < last {
				t.Errorf("script does not print marker %s in order:\n%s", m, script)
			}
			last = i
		}
	}
	if !strings.Contains(GoBuildScript, "BENCH-GOCACHE entries=") {
		t.Error("GoBuildScript does not print the GOCACHE count")
	}
}

func TestParseGoCacheEntries(t *testing.T) {
	if n, err := ParseGoCacheEntries("x\nBENCH-GOCACHE entries=258\n"); n != 258 || err != nil {
		t.Errorf("got %d, %v", n, err)
	}
	if _, err := ParseGoCacheEntries("BENCH-GOCACHE entries=\n"); err == nil {
		t.Error("an empty count parsed")
	}
	if _, err := ParseGoCacheEntries("nothing"); err == nil {
		t.Error("a log without the line parsed")
	}
}

// window is a write window of seconds with node agent and manager writes
// by method.
func window(seconds float64, node, manager map[string]float64) *WriteWindow {
	w := NewWriteWindow(seconds, nil, nil, nil)
	w.Unavailable = map[string]string{}
	w.Writes = map[string]map[string]float64{ComponentNode: {}, ComponentManager: {}}
	for _, m := range WriteMethods {
		w.Writes[ComponentNode][m] = node[m]
		w.Writes[ComponentManager][m] = manager[m]
	}
	return &w
}

func TestSummarizeCSI(t *testing.T) {
	var runs []CSIRun
	add := func(g string, v Variant, run int, secs float64, w *WriteWindow) {
		runs = append(runs, CSIRun{Group: g, Variant: v, Run: run, Seconds: secs, StartSeconds: secs / 2, EndSeconds: secs / 4,
			CommitSeconds: -0.5, BuildSeconds: 1, Writes: w})
	}
	bg := func(put float64) *WriteWindow { return window(4, nil, map[string]float64{"PUT": put}) }
	// The warm-up runs (-1) are not measured.
	add(GroupTrivial, VariantEmptyDir, -1, 100, bg(2))
	add(GroupTrivial, VariantCSI, -1, 100, window(4, map[string]float64{"PATCH": 9}, nil))
	add(GroupTrivial, VariantCSIRegistry, -1, 100, nil)
	add(GroupTrivial, VariantClaim, -1, 100, nil)
	for run, s := range []float64{2, 1, 3} {
		add(GroupTrivial, VariantEmptyDir, run, s, bg(2))
		add(GroupTrivial, VariantCSI, run, 1.05*s, window(4, map[string]float64{"POST": 1, "PATCH": 1}, map[string]float64{"PUT": 2}))
		// The registry pod's node agent also announces and appends to
		// the chain (2 PATCHes more than the plain pod's).
		add(GroupTrivial, VariantCSIRegistry, run, 1.08*s, window(4, map[string]float64{"POST": 1, "PATCH": 3}, map[string]float64{"PUT": 2}))
		add(GroupTrivial, VariantClaim, run, 2*s, window(4, map[string]float64{"POST": 4}, map[string]float64{"PUT": 2}))
		add(GroupGoBuild, VariantHostPath, run, 10*s, window(10, nil, map[string]float64{"PUT": 5}))
		add(GroupGoBuild, VariantCSI, run, 13*s, nil)
	}
	rows, err := SummarizeCSI(runs)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		g       string
		v       Variant
		median  float64
		ratio   float64
		verdict string
		target  float64
	}{
		{GroupTrivial, VariantEmptyDir, 2, 0, "", 0},
		{GroupTrivial, VariantCSI, 2.1, 1.05, "met", TargetRatio},
		{GroupTrivial, VariantCSIRegistry, 2.16, 1.08, "met", TargetRatio},
		{GroupTrivial, VariantClaim, 4, 2, "MISSED CLEARLY", 0},
		{GroupGoBuild, VariantHostPath, 20, 0, "", 0},
		{GroupGoBuild, VariantCSI, 26, 1.3, "missed", TargetRatio},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows: %+v", len(rows), rows)
	}
	for i, w := range want {
		r := rows[i]
		if r.Group != w.g || r.Variant != w.v || math.Abs(r.Seconds.MedianSeconds-w.median) > 1e-9 || math.Abs(r.Ratio-w.ratio) > 1e-9 ||
			r.Verdict != w.verdict || r.Target != w.target || len(r.Seconds.SamplesSeconds) != 3 {
			t.Errorf("row %d = %+v, want %+v", i, r, w)
		}
		if (r.CommitSeconds != nil) != w.v.layercache() || (r.BuildSeconds != nil) != (w.g == GroupGoBuild) {
			t.Errorf("row %d: commit %v, build %v", i, r.CommitSeconds, r.BuildSeconds)
		}
		if math.Abs(r.StartSeconds.MedianSeconds-w.median/2) > 1e-9 {
			t.Errorf("row %d: start %v", i, r.StartSeconds)
		}
	}

	writes, notes := SummarizeCSIWrites(runs)
	// Trivial: background 0.5/s over 4 s; CSI: 4 per run, net 2; registry
	// CSI: 6, net 4, no target; claim: 6, net 4. The Go build's CSI runs
	// have no windows: a note, no row.
	if len(writes) != 3 {
		t.Fatalf("writes = %+v", writes)
	}
	if w := writes[0]; w.Variant != VariantCSI || w.Counted != 3 || w.PerRun.Median != 4 || w.BackgroundPerSecond.Median != 0.5 ||
		w.NetPerPod != 2 || w.Verdict != "met" || w.Target != TargetWrites {
		t.Errorf("CSI writes = %+v", w)
	}
	if w := writes[1]; w.Variant != VariantCSIRegistry || w.Counted != 3 || w.PerRun.Median != 6 || w.NetPerPod != 4 || w.Target != 0 || w.Verdict != "" {
		t.Errorf("registry CSI writes = %+v", w)
	}
	if w := writes[2]; w.Variant != VariantClaim || w.NetPerPod != 4 || w.Verdict != "" {
		t.Errorf("claim writes = %+v", w)
	}
	if len(notes) != 4 || !strings.Contains(notes[3], "gobuild, csi: no run's writes could be counted") {
		t.Errorf("notes = %q", notes)
	}

	report := CSIReport{Started: time.Unix(1, 0).UTC(), Finished: time.Unix(2, 0).UTC(), Backend: "local", Node: "n", Runs: 3,
		SameFilesystem: true, Rows: rows, Writes: writes, Objects: CSIObjects{Claims: []string{"triv-claim-0-cache"}, Volumes: []string{}},
		Notes: notes, Definitions: CSIDefinitions, Samples: runs}
	dir := t.TempDir()
	if err := report.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "csi.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back CSIReport
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Rows, report.Rows) || !reflect.DeepEqual(back.Writes, report.Writes) || len(back.Samples) != len(runs) {
		t.Errorf("csi.json does not round-trip")
	}
	txt, err := os.ReadFile(filepath.Join(dir, "csi.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"≤ 1.1 met", "≤ 1.1 missed", "≤ 4 met", "1.05", "1.08", "none (≤ 9 by the code)", VariantTitles[VariantCSIRegistry], "1 claims, 0 PVs", "made by CSI pods: 0 claims, 0 PVs", "ratio / emptyDir", "ratio / hostPath"} {
		if !strings.Contains(string(txt), want) {
			t.Errorf("csi.txt lacks %q:\n%s", want, txt)
		}
	}
}
