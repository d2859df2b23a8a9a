//go:build e2e

package cache

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
)

// snapshotPod is cachePod on the snapshot layout's StorageClass, with a
// claim of size: the volume's live size limit.
func (e *env) snapshotPod(name, cache, size, script string, kv ...string) *corev1.Pod {
	pod := e.cachePod(name, cacheAnnotations(cache, kv...), script)
	useClass(&pod.Spec, v1alpha1.SnapshotStorageClassName, size)
	return pod
}

// useClass makes the cache volume of spec a claim of class for size.
func useClass(spec *corev1.PodSpec, class, size string) {
	claim := &spec.Volumes[0].Ephemeral.VolumeClaimTemplate.Spec
	claim.StorageClassName = &class
	claim.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(size)
}

// TestSnapshotLayout: a cache of the snapshot layout passes its files from
// one pod to the next, and its size limit holds during the build.
func TestSnapshotLayout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "snap"

	first := e.runPod(ctx, e.snapshotPod("first", cacheName, "256Mi",
		"mkdir -p /cache/dir && echo one > /cache/dir/file && dd if=/dev/zero of=/cache/blob bs=1M count=8 2>/dev/null"), corev1.PodSucceeded)
	e.expectVolumeEnd(ctx, first.Name, "Committed")
	e.waitGeneration(ctx, cacheName, 1)

	// Past the claim's 64Mi, the write itself fails: the build sees
	// EDQUOT, fails, and its volume is discarded.
	script := "cat /cache/dir/file; dd if=/dev/zero of=/cache/big bs=1M count=128 2>&1; echo dd-exit=$?; sync; exit 1"
	over := e.runPod(ctx, e.snapshotPod("over", cacheName, "64Mi", script), corev1.PodFailed)
	out := e.logs(ctx, over.Name)
	if !strings.HasPrefix(out, "one\n") {
		t.Errorf("the second pod reads %q first, want the first pod's file (one)", out)
	}
	if !strings.Contains(out, "Disk quota exceeded") || strings.Contains(out, "dd-exit=0") {
		t.Errorf("a write of 128Mi on a 64Mi snapshot volume: %q, want dd to fail with Disk quota exceeded", out)
	}
	e.expectVolumeEnd(ctx, over.Name, "Discarded")

	check := e.runPod(ctx, e.snapshotPod("check", cacheName, "256Mi", "ls -1A /cache; stat -c %s /cache/blob",
		v1alpha1.AnnotationMode, string(v1alpha1.ModeRead)), corev1.PodSucceeded)
	if got, want := e.logs(ctx, check.Name), "blob\ndir\n8388608\n"; got != want {
		t.Errorf("after the failed build the cache holds %q, want the first build's %q", got, want)
	}
	e.waitGeneration(ctx, cacheName, 1)
}

// TestSnapshotConcurrentWriters: two pods of one snapshot cache run at the
// same time and both commit. The later commit is the whole new head
// (whole-volume last writer wins, unlike the overlay layout's per-file
// merge): the next pod sees every file of exactly one writer, none of the
// other's.
func TestSnapshotConcurrentWriters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "snap-shared"

	writers := []string{"snap-writer-a", "snap-writer-b"}
	for _, w := range writers {
		script := fmt.Sprintf("for i in 1 2 3; do echo %s > /cache/%s-$i; done && until [ -e /tmp/go ]; do sleep 1; done", w, w)
		if _, err := e.CreatePod(ctx, e.snapshotPod(w, cacheName, "256Mi", script)); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range writers {
		if _, err := e.WaitForPodPhase(ctx, w, corev1.PodRunning); err != nil {
			t.Fatal(err)
		}
	}
	committed := map[string]int64{}
	for _, w := range writers {
		e.exec(ctx, w, "touch /tmp/go")
		if _, err := e.WaitForPodPhase(ctx, w, corev1.PodSucceeded); err != nil {
			t.Fatal(err)
		}
		end := e.expectVolumeEnd(ctx, w, "Committed")
		gen, err := strconv.ParseInt(end.PV.Annotations[v1alpha1.AnnotationCommittedGeneration], 10, 64)
		if err != nil {
			t.Fatalf("volume of %s: committed generation %q: %v", w, end.PV.Annotations[v1alpha1.AnnotationCommittedGeneration], err)
		}
		committed[w] = gen
	}
	e.waitGeneration(ctx, cacheName, 2)
	later := writers[0]
	if committed[writers[1]] > committed[writers[0]] {
		later = writers[1]
	}

	reader := e.runPod(ctx, e.snapshotPod("snap-reader", cacheName, "256Mi", "ls -1A /cache",
		v1alpha1.AnnotationMode, string(v1alpha1.ModeRead)), corev1.PodSucceeded)
	got := lines(e.logs(ctx, reader.Name))
	want := []string{later + "-1", later + "-2", later + "-3"}
	if !slices.Equal(got, want) {
		t.Errorf("after both commits (generations %v) the cache holds %q, want exactly the later writer's files %q", committed, got, want)
	}
}

// TestSnapshotNestedSubvolume (issue 33, finding 1): a build without
// privileges creates btrfs subvolumes inside its snapshot volume, two
// levels deep, and writes past the volume's limit into the deepest: the
// write fails with EDQUOT, as it would in the volume itself. The build
// fails; at its end the volume goes, nested subvolumes and all, and the
// node's clean-up goes on: the next build of the cache commits.
func TestSnapshotNestedSubvolume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "snap-nested"
	helper := e.subvolumeHelper(ctx)

	script := "/helper/subvolume /cache/nested && /helper/subvolume /cache/nested/deeper && " +
		"dd if=/dev/zero of=/cache/nested/deeper/big bs=1M count=64 2>&1; echo dd-exit=$?; sync; exit 1"
	pod := e.snapshotPod("nest", cacheName, "16Mi", script)
	pod.Spec.Volumes = append(pod.Spec.Volumes, helper)
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: helper.Name, MountPath: "/helper", ReadOnly: true})
	c.SecurityContext = &corev1.SecurityContext{
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		AllowPrivilegeEscalation: new(false),
	}
	nest := e.runPod(ctx, pod, corev1.PodFailed)
	out := e.logs(ctx, nest.Name)
	if !strings.Contains(out, "Disk quota exceeded") || strings.Contains(out, "dd-exit=0") {
		t.Errorf("a write of 64Mi into a subvolume nested in a 16Mi snapshot volume: %q, want dd to fail with Disk quota exceeded", out)
	}
	end := e.expectVolumeEnd(ctx, nest.Name, "Discarded")
	if hp := end.PV.Spec.HostPath; hp != nil {
		err := wait.PollUntilContextTimeout(ctx, pollInterval, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := e.Cluster.NodeExec(ctx, e.Node, "sh", "-c", `test ! -e "$1"`, "sh", hp.Path)
			return err == nil, nil
		})
		if err != nil {
			t.Errorf("the ended volume with nested subvolumes is still on the node at %s: %v", hp.Path, err)
		}
	} else {
		t.Errorf("the volume's PV has no hostPath: %+v", end.PV.Spec.PersistentVolumeSource)
	}

	next := e.runPod(ctx, e.snapshotPod("next", cacheName, "16Mi", "ls -A /cache; echo next > /cache/next"), corev1.PodSucceeded)
	if got := e.logs(ctx, next.Name); got != "" {
		t.Errorf("the next build sees %q in the cache, want it empty (the failed build was discarded)", got)
	}
	e.expectVolumeEnd(ctx, next.Name, "Committed")
	e.waitGeneration(ctx, cacheName, 1)
}

// subvolumeHelper builds cmd/subvolume for the node (the nodes share the
// host's filesystem) and returns a hostPath volume of its directory.
func (e *env) subvolumeHelper(ctx context.Context) corev1.Volume {
	e.t.Helper()
	dir := filepath.Join("/var/tmp/layercache-e2e-bin", e.Namespace)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { os.RemoveAll(dir) })
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "subvolume"), "./cmd/subvolume")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("building cmd/subvolume: %v\n%s", err, out)
	}
	return corev1.Volume{Name: "helper", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: new(corev1.HostPathDirectory)},
	}}
}
