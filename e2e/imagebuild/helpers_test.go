//go:build e2e

// Package imagebuild holds the e2e scenarios of an image builder whose
// state lives in a cache volume: a privileged pod runs BuildKit (buildkitd
// with its --root on the volume, and buildctl) as GitLab's docker:dind
// services and Tekton's buildkit task do, builds a multi-stage Dockerfile,
// and leaves BuildKit's cache to the next pod that names the cache.
//
// The image localhost/buildkit:e2e comes from e2e/cluster/buildkit.sh
// (make up WITH=buildkit; make e2e asks for it). The cluster has no
// registry, so the Dockerfile starts FROM the e2e busybox image, which the
// image holds as an OCI layout and buildctl gives the build as a named
// context. docs/image-builders.md is the recipe these scenarios check.
package imagebuild

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

const (
	// imageBuildKit is e2e/cluster/buildkit.sh's image.
	imageBuildKit = "localhost/buildkit:e2e"

	// scenarioTimeout bounds one scenario: two builds of about 15 s of CPU
	// each on a busy 2-core machine, their pods and the commit between.
	scenarioTimeout = 10 * time.Minute
	// buildTimeout bounds one build pod from its creation to its end.
	buildTimeout = 5 * time.Minute
	pollInterval = 250 * time.Millisecond

	// volumeName is the pod volume of the cache; its generic ephemeral
	// claim is called <pod>-cache.
	volumeName = "cache"
	mountPath  = "/cache"

	// snapshotClass is config/'s StorageClass of the snapshot layout
	// (docs/using.md, "Volume layouts"): btrfs snapshots instead of overlay
	// mounts, so that BuildKit can stack its own overlay mounts on the
	// volume.
	snapshotClass = "layercache-snapshot"
	// speedup is how much faster the second build must be: every step of
	// it comes from the cache the first left, so what remains is BuildKit's
	// start of a session and the export.
	speedup = 5
)

// dockerfile is the build: a first stage whose RUN stands in for a
// compile, real CPU work (sha256 of 3 GB, about 13 s of one core here),
// and a second stage that takes only its product. Deterministic, so both
// builds would produce the same image even without a cache.
const dockerfile = `FROM busybox AS compile
RUN mkdir /out && head -c 3000000000 /dev/zero | sha256sum | tee /out/digest
FROM busybox
COPY --from=compile /out/ /out/
`

// buildScript is what a build pod runs: buildkitd in the background with
// its state on the cache volume, one buildctl build of dockerfile timed
// from inside the pod (/proc/uptime, the only clock with sub-second
// resolution in busybox), then a graceful stop of buildkitd, so that its
// bolt databases are closed before the volume is committed. Its log is
// sections (=== NAME) that parseRun reads.
const buildScript = `set -u
root=` + mountPath + `/buildkit
mkdir -p "$root" /tmp/context
cat >/tmp/context/Dockerfile <<'DOCKERFILE'
` + dockerfile + `DOCKERFILE
buildkitd --root "$root" --oci-worker-net=host >/tmp/buildkitd.log 2>&1 &
daemon=$!
ready=
for i in $(seq 300); do
	if buildctl debug workers >/dev/null 2>&1; then ready=1; break; fi
	kill -0 "$daemon" 2>/dev/null || break
	sleep 0.2
done
if [ -z "$ready" ]; then
	echo "=== buildkitd"; cat /tmp/buildkitd.log
	echo "buildkitd did not answer within 60 s"; exit 1
fi
buildctl debug workers --verbose >/tmp/workers.txt 2>&1
start=$(cut -d' ' -f1 /proc/uptime)
rc=0
buildctl build --progress=plain --frontend dockerfile.v0 \
	--local context=/tmp/context --local dockerfile=/tmp/context \
	--oci-layout base=/oci/busybox --opt context:busybox=oci-layout://base@$(cat /oci/busybox.digest) \
	--output type=oci,dest=/tmp/image.tar >/tmp/build.log 2>&1 || rc=$?
end=$(cut -d' ' -f1 /proc/uptime)
kill -TERM "$daemon"
wait "$daemon"
echo "=== workers"; cat /tmp/workers.txt
echo "=== build"; cat /tmp/build.log
echo "=== buildkitd"; cat /tmp/buildkitd.log
echo "=== result"
echo "seconds $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')"
echo "exit $rc"
echo "image $(wc -c </tmp/image.tar 2>/dev/null || echo 0)"
echo "volume $(awk '$2 == "` + mountPath + `" { print $3 }' /proc/mounts)"
exit "$rc"
`

// env is one scenario's handle: the framework's namespace and clients and
// the node every pod runs on (a cache lives on the node that mounts it).
type env struct {
	*framework.Framework
	Node framework.Node
	pvs  *framework.PVWatch
	t    *testing.T
}

func newEnv(t *testing.T) *env {
	t.Helper()
	f := framework.New(t)
	return &env{Framework: f, Node: f.Cluster.Nodes[0], t: t}
}

// buildPod is a privileged pod that runs buildScript with its cache
// volume, of class and naming cache, at mountPath. Privileged as CI
// systems run BuildKit and Docker: buildkitd mounts its snapshots and
// runs each RUN step in a container of its own with runc.
func (e *env) buildPod(name, class, cache string) *corev1.Pod {
	privileged := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(30)),
			NodeSelector:                  map[string]string{corev1.LabelHostname: e.Node.Name},
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           imageBuildKit,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sh", "-c", buildScript},
				SecurityContext: &corev1.SecurityContext{Privileged: &privileged},
				VolumeMounts:    []corev1.VolumeMount{{Name: volumeName, MountPath: mountPath}},
			}},
			Volumes: []corev1.Volume{{Name: volumeName, VolumeSource: corev1.VolumeSource{
				Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
					ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationCache: cache}},
					Spec: corev1.PersistentVolumeClaimSpec{
						AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
						StorageClassName: &class,
						Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceStorage: resource.MustParse("2Gi"),
						}},
					},
				}},
			}}},
		},
	}
}

// buildRun is what one build pod reported.
type buildRun struct {
	Pod string
	// Seconds is buildctl build's wall time inside the pod.
	Seconds float64
	// Snapshotter is the one buildkitd's worker chose
	// (org.mobyproject.buildkit.worker.snapshotter).
	Snapshotter string
	// Steps are the Dockerfile's steps as buildctl --progress=plain names
	// them ("[compile 1/2] RUN ..."), in order.
	Steps []step
	// Daemon is buildkitd's log; Build is buildctl's output.
	Daemon, Build string
	Exit          int
	ImageBytes    int64
	// Volume is the filesystem type of the cache volume in the pod
	// (/proc/mounts): overlay, or btrfs for the snapshot layout.
	Volume string
}

// step is one vertex of the build's progress.
type step struct {
	Name   string
	Cached bool
	// Done is the step's time as BuildKit reported it ("#N DONE 16.3s");
	// empty for a cached step.
	Done string
}

// build runs one build pod to its end on class with cache and returns
// what it reported; it fails the test if the pod failed, naming why.
func (e *env) build(ctx context.Context, name, class, cache string) buildRun {
	e.t.Helper()
	if _, err := e.CreatePod(ctx, e.buildPod(name, class, cache)); err != nil {
		e.t.Fatal(err)
	}
	e.waitStarted(ctx, name, class)
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, time.Second, buildTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := e.Client.CoreV1().Pods(e.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil {
		e.t.Fatalf("build pod %s/%s did not end within %s: %v", e.Namespace, name, buildTimeout, err)
	}
	logs, err := e.PodLogs(ctx, name, "main")
	if err != nil {
		e.t.Fatal(err)
	}
	run, err := parseRun(logs)
	run.Pod = name
	if err != nil || pod.Status.Phase != corev1.PodSucceeded {
		e.t.Fatalf("build pod %s/%s ended %s (%v); its log:\n%s", e.Namespace, name, pod.Status.Phase, err, logs)
	}
	return run
}

// waitStarted waits until the build pod runs (or has run). A claim of
// class that the node agent refuses fails the test at once with the
// agent's reason: for the snapshot class that is what remains to be done.
func (e *env) waitStarted(ctx context.Context, pod, class string) {
	e.t.Helper()
	claim := pod + "-" + volumeName // ephemeral.VolumeClaimName
	var refusal *corev1.Event
	_, err := e.WaitForPod(ctx, pod, func(p *corev1.Pod) (bool, error) {
		if p.Status.Phase != corev1.PodPending {
			return true, nil
		}
		sel := fields.Set{"involvedObject.kind": "PersistentVolumeClaim", "involvedObject.name": claim}.AsSelector().String()
		events, err := e.Client.CoreV1().Events(e.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		for i, ev := range events.Items {
			// The agent records events.k8s.io Events: the core view has the
			// reporter in reportingComponent, not in source.
			if ev.Type == corev1.EventTypeWarning && ev.ReportingController == "layercache-node" {
				refusal = &events.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if refusal != nil {
		if class == snapshotClass {
			e.t.Fatalf("the node agent refuses the claim %s of StorageClass %s (parameters layout: snapshot): %s: %s; "+
				"a node agent without the snapshot layout refuses its layout parameter (deploy one with it: make up), "+
				"one with it must provision the claim as a btrfs snapshot",
				claim, class, refusal.Reason, refusal.Message)
		}
		e.t.Fatalf("the node agent refuses the claim %s of StorageClass %s: %s: %s", claim, class, refusal.Reason, refusal.Message)
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// waitCommitted waits until the node agent committed the volume of pod
// and checks that the cache reached generation gen on the node: the next
// pod must start from it.
func (e *env) waitCommitted(ctx context.Context, pod, cache string, gen int) {
	e.t.Helper()
	claim := pod + "-" + volumeName
	pv := e.pvs.Wait(ctx, e.t, claim)
	if reason, msg := e.VolumeEnd(ctx, claim, pv.Name); reason != "Committed" {
		e.t.Fatalf("volume %s of build pod %s: %s (%s), want Committed: the next build would start cold", pv.Name, pod, reason, msg)
	}
	if got := e.CacheGeneration(ctx, e.Node, cache); got != gen {
		e.t.Fatalf("cache %s/%s is at generation %d on %s after the commit of %s, want %d", e.Namespace, cache, got, e.Node.Name, pod, gen)
	}
}

// requireSnapshotClass checks that the snapshot layout's StorageClass,
// which config/ installs beside layercache, is there as the recipe has it.
func (e *env) requireSnapshotClass(ctx context.Context) {
	e.t.Helper()
	class, err := e.Client.StorageV1().StorageClasses().Get(ctx, snapshotClass, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		e.t.Fatalf("StorageClass %s (layout: snapshot) is missing: config/ installs it; deploy again with make up (or make deploy)", snapshotClass)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	if class.Provisioner != v1alpha1.ProvisionerName || class.Parameters["layout"] != "snapshot" {
		e.t.Fatalf("StorageClass %s has provisioner %s and parameters %v, want %s and layout: snapshot (config/'s); deploy config/ again",
			snapshotClass, class.Provisioner, class.Parameters, v1alpha1.ProvisionerName)
	}
}

// parseRun reads buildScript's log.
func parseRun(logs string) (buildRun, error) {
	var r buildRun
	sections := map[string]string{}
	name := ""
	for line := range strings.Lines(logs) {
		if s, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "=== "); ok {
			name = s
			continue
		}
		sections[name] += line
	}
	r.Daemon, r.Build = sections["buildkitd"], sections["build"]
	for _, want := range []string{"workers", "build", "buildkitd", "result"} {
		if _, ok := sections[want]; !ok {
			return r, fmt.Errorf("the build's log has no section %q", want)
		}
	}
	for line := range strings.Lines(sections["workers"]) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "org.mobyproject.buildkit.worker.snapshotter:"); ok {
			r.Snapshotter = strings.TrimSpace(v)
		}
	}
	for line := range strings.Lines(sections["result"]) {
		key, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		var err error
		switch key {
		case "seconds":
			r.Seconds, err = strconv.ParseFloat(value, 64)
		case "exit":
			r.Exit, err = strconv.Atoi(value)
		case "image":
			r.ImageBytes, err = strconv.ParseInt(value, 10, 64)
		case "volume":
			r.Volume = value
		}
		if err != nil {
			return r, fmt.Errorf("result line %q: %w", line, err)
		}
	}
	r.Steps = parseSteps(r.Build)
	if r.Exit != 0 {
		return r, fmt.Errorf("buildctl build exited %d", r.Exit)
	}
	return r, nil
}

// progressLine is a line of buildctl --progress=plain: "#N TEXT".
var progressLine = regexp.MustCompile(`^#(\d+) (.*)$`)

// dockerfileStep names the vertices of the Dockerfile's own instructions,
// "[STAGE I/N] INSTRUCTION ...", beside BuildKit's internal ones
// ("[internal] load ...", "[context busybox] ...", "exporting ...").
var dockerfileStep = regexp.MustCompile(`^\[[^\]]* \d+/\d+\] `)

// parseSteps lists the Dockerfile steps of buildctl's plain progress, in
// the order they started, each marked cached when BuildKit reported the
// vertex CACHED.
func parseSteps(progress string) []step {
	var order []string
	steps := map[string]*step{}
	for line := range strings.Lines(progress) {
		m := progressLine.FindStringSubmatch(strings.TrimRight(line, "\n"))
		if m == nil {
			continue
		}
		id, text := m[1], m[2]
		if s, ok := steps[id]; ok {
			if text == "CACHED" {
				s.Cached = true
			}
			if d, ok := strings.CutPrefix(text, "DONE "); ok {
				s.Done = d
			}
			continue
		}
		if !dockerfileStep.MatchString(text) {
			continue
		}
		steps[id] = &step{Name: text}
		order = append(order, id)
	}
	out := make([]step, 0, len(order))
	for _, id := range order {
		out = append(out, *steps[id])
	}
	return out
}

// uncached lists the names of the steps BuildKit ran rather than took
// from its cache.
func (r buildRun) uncached() []string {
	var names []string
	for _, s := range r.Steps {
		if !s.Cached {
			names = append(names, s.Name)
		}
	}
	return names
}

// hasStep tells whether a step whose name starts with prefix ran.
func (r buildRun) hasStep(prefix string) bool {
	return slices.ContainsFunc(r.Steps, func(s step) bool {
		_, rest, ok := strings.Cut(s.Name, "] ")
		return ok && strings.HasPrefix(rest, prefix)
	})
}
