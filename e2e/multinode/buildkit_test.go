//go:build e2e && multinode

package multinode

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// buildKitScript is e2e/imagebuild's build (its buildScript and
// Dockerfile, trimmed to what this test reads): buildkitd with its state
// on the cache volume, one buildctl build of a Dockerfile whose RUN is
// about 4 s of CPU (a third of e2e/imagebuild's), timed inside the pod,
// then a graceful stop of buildkitd so that its databases are closed
// before the commit. It prints "seconds S" and then buildctl's plain
// progress.
const buildKitScript = `set -u
root=/cache/buildkit
mkdir -p "$root" /tmp/context
cat >/tmp/context/Dockerfile <<'DOCKERFILE'
FROM busybox AS compile
RUN mkdir /out && head -c 1000000000 /dev/zero | sha256sum | tee /out/digest
FROM busybox
COPY --from=compile /out/ /out/
DOCKERFILE
buildkitd --root "$root" --oci-worker-net=host >/tmp/buildkitd.log 2>&1 &
daemon=$!
for i in $(seq 300); do
	buildctl debug workers >/dev/null 2>&1 && break
	kill -0 "$daemon" 2>/dev/null || { cat /tmp/buildkitd.log; exit 1; }
	sleep 0.2
done
start=$(cut -d' ' -f1 /proc/uptime)
rc=0
buildctl build --progress=plain --frontend dockerfile.v0 \
	--local context=/tmp/context --local dockerfile=/tmp/context \
	--oci-layout base=/oci/busybox --opt context:busybox=oci-layout://base@$(cat /oci/busybox.digest) \
	--output type=oci,dest=/tmp/image.tar >/tmp/build.log 2>&1 || rc=$?
end=$(cut -d' ' -f1 /proc/uptime)
kill -TERM "$daemon"
wait "$daemon"
echo "seconds $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')"
cat /tmp/build.log
exit "$rc"
`

// imageBuildKit is e2e/cluster/buildkit.sh's image, imported on every
// node (WITH=buildkit).
const imageBuildKit = "localhost/buildkit:e2e"

// buildKitRun is one build: its time inside the pod and its Dockerfile
// steps, each marked cached or not.
type buildKitRun struct {
	seconds float64
	steps   map[string]bool // "[compile 2/2] RUN ..." -> cached
	log     string
}

// runBuildKit runs buildKitScript in a privileged pod on node with the
// cache buildkit of class at /cache, as CI systems run BuildKit.
func (e *syncEnv) runBuildKit(ctx context.Context, name, node, class string) buildKitRun {
	e.t.Helper()
	pod := e.buildPod(name, node, "buildkit", class, "")
	privileged := true
	c := &pod.Spec.Containers[0]
	c.Image, c.Command = imageBuildKit, []string{"sh", "-c", buildKitScript}
	c.SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
	out := e.runBuild(ctx, pod)
	r, err := parseBuildKitRun(out)
	if err != nil {
		e.t.Fatalf("build pod %s: %v; its log:\n%s", name, err, out)
	}
	return r
}

var (
	buildKitLine = regexp.MustCompile(`^#(\d+) (.*)$`)
	// buildKitStep names the Dockerfile's own vertices: "[STAGE I/N] ...".
	buildKitStep = regexp.MustCompile(`^\[[^\]]* \d+/\d+\] `)
)

func parseBuildKitRun(log string) (buildKitRun, error) {
	r := buildKitRun{steps: map[string]bool{}, log: log}
	names := map[string]string{} // vertex -> step name
	for line := range strings.Lines(log) {
		line = strings.TrimRight(line, "\n")
		if v, ok := strings.CutPrefix(line, "seconds "); ok {
			s, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return r, fmt.Errorf("line %q: %w", line, err)
			}
			r.seconds = s
			continue
		}
		m := buildKitLine.FindStringSubmatch(line)
		switch {
		case m == nil:
		case names[m[1]] != "" && m[2] == "CACHED":
			r.steps[names[m[1]]] = true
		case names[m[1]] == "" && buildKitStep.MatchString(m[2]):
			names[m[1]] = m[2]
			r.steps[m[2]] = false
		}
	}
	if r.seconds == 0 || len(r.steps) == 0 {
		return r, fmt.Errorf("no build time or no Dockerfile steps in the log")
	}
	return r, nil
}

// TestBuildKitCacheFollowsTheBuilderAcrossNodes: BuildKit's state on a
// snapshot cache of a registry class. A build on node A runs every step;
// the same build on node B, whose node pulls the generation A published,
// takes every step from that cache and is at least 5x faster.
func TestBuildKitCacheFollowsTheBuilderAcrossNodes(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	class := e.snapshotClass(ctx)

	first := e.runBuildKit(ctx, "buildkit-a", a, class)
	e.waitPublished(ctx, "buildkit", 1)
	second := e.runBuildKit(ctx, "buildkit-b", b, class)
	t.Logf("BuildKit on node %s: %.2fs; on node %s: %.2fs (%.1fx faster)", a, first.seconds, b, second.seconds, first.seconds/second.seconds)
	for step, cached := range first.steps {
		if cached {
			t.Errorf("the first build, on an empty cache, took %q from a cache", step)
		}
	}
	if len(second.steps) != len(first.steps) {
		t.Errorf("the second build shows steps %v, want those of the first: %v", second.steps, first.steps)
	}
	for step, cached := range second.steps {
		if !cached {
			t.Errorf("the build on %s ran %q again instead of taking it from the cache node %s published; its log:\n%s", b, step, a, second.log)
		}
	}
	if second.seconds*5 > first.seconds {
		t.Errorf("the build on %s took %.2fs, the first %.2fs: want it at least 5x faster", b, second.seconds, first.seconds)
	}
}
