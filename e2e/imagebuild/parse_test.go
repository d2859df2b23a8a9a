//go:build e2e

package imagebuild

import (
	"slices"
	"testing"
)

// A second build's log as buildScript prints it, trimmed; buildctl's
// progress as v0.34.2 prints it.
const warmLog = `=== workers
Labels:
	org.mobyproject.buildkit.worker.executor:		oci
	org.mobyproject.buildkit.worker.snapshotter:		native
=== build
#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s

#4 [context busybox] OCI load from client
#4 DONE 0.0s

#5 [compile 1/2] RUN mkdir /out && head -c 3000000000 /dev/zero | sha256sum | tee /out/digest
#5 CACHED

#6 [stage-1 1/2] COPY --from=compile /out/ /out/
#6 CACHED

#7 exporting to oci image format
#7 DONE 0.1s
=== buildkitd
time="2026-11-26T01:16:15Z" level=info msg="auto snapshotter: using native"
=== result
seconds 0.32
exit 0
image 1163264
volume overlay
`

// TestParseRun: the parser finds the Dockerfile's steps among BuildKit's
// internal vertices, and the times and labels the scenarios assert on.
func TestParseRun(t *testing.T) {
	r, err := parseRun(warmLog)
	if err != nil {
		t.Fatal(err)
	}
	want := []step{
		{Name: "[compile 1/2] RUN mkdir /out && head -c 3000000000 /dev/zero | sha256sum | tee /out/digest", Cached: true},
		{Name: "[stage-1 1/2] COPY --from=compile /out/ /out/", Cached: true},
	}
	if !slices.Equal(r.Steps, want) {
		t.Errorf("steps = %+v, want %+v", r.Steps, want)
	}
	if r.Seconds != 0.32 || r.Exit != 0 || r.ImageBytes != 1163264 || r.Snapshotter != "native" || r.Volume != "overlay" {
		t.Errorf("parsed %+v, want 0.32 s, exit 0, 1163264 bytes, snapshotter native, volume overlay", r)
	}
	if !r.hasStep("RUN ") || !r.hasStep("COPY ") || len(r.uncached()) != 0 {
		t.Errorf("hasStep/uncached disagree with steps %+v", r.Steps)
	}
	if _, err := parseRun("=== build\n#1 x\n"); err == nil {
		t.Error("a log without its result section parsed without error")
	}
}
