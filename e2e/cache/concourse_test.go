//go:build e2e

package cache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestConcoursePattern runs Concourse's cache model with plain pods, as a
// Concourse runtime on Kubernetes would map it onto layercache:
//
//   - A resource cache holds one version of a resource's config, fetched
//     once by a get step and then shared read-only by every step that uses
//     that version: cache rc-RESOURCE-HASH(config, version), which the get
//     step writes only when it is empty (commit on-success), and tasks read
//     with mode read.
//   - A task cache belongs to one job, step and cache path, and carries over
//     from build to build of that step: cache tc-JOB-STEP-HASH(path), mode
//     write, commit always (Concourse keeps a task's caches whatever its
//     result).
//
// Two builds of a job whose get step fetches a resource and whose two
// task steps each keep a cache: the second build's get is a hit and writes
// nothing, and each task sees its own cache of the first build, never the
// other task's.
func TestConcoursePattern(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	resource := concourseCache("rc", "repo", "uri: https://git.example/app.git", "ref: 4f2c1d")
	taskCaches := map[string]string{
		"lint": concourseCache("tc", "unit-lint", "gocache"),
		"test": concourseCache("tc", "unit-test", "gocache"),
	}

	for build := 1; build <= 2; build++ {
		get := e.runPod(ctx, e.cachePod(fmt.Sprintf("get-%d", build), cacheAnnotations(resource),
			`if [ -e /cache/.fetched ]; then echo hit; else echo fetch; echo "source 4f2c1d" > /cache/src; touch /cache/.fetched; fi`),
			corev1.PodSucceeded)
		want := map[int]string{1: "fetch\n", 2: "hit\n"}[build]
		if got := e.logs(ctx, get.Name); got != want {
			t.Errorf("build %d: get step printed %q, want %q", build, got, want)
		}
		e.expectVolumeEnd(ctx, get.Name, "Committed")
		e.waitGeneration(ctx, resource, 1)

		for step, cache := range taskCaches {
			pod := e.concourseTask(fmt.Sprintf("%s-%d", step, build), resource, cache,
				fmt.Sprintf(`set -e; cat /input/src; cat /cache/log 2>/dev/null || true; echo "%s build %d" >> /cache/log`, step, build))
			if _, err := e.CreatePod(ctx, pod); err != nil {
				t.Fatal(err)
			}
		}
		for step, cache := range taskCaches {
			name := fmt.Sprintf("%s-%d", step, build)
			if _, err := e.WaitForPodPhase(ctx, name, corev1.PodSucceeded); err != nil {
				t.Fatal(err)
			}
			e.expectClaimEnd(ctx, name+"-input", "Discarded")
			e.expectClaimEnd(ctx, name+"-"+volumeName, "Committed")
			e.waitGeneration(ctx, cache, int64(build))
			want := "source 4f2c1d\n"
			if build == 2 {
				want += step + " build 1\n"
			}
			if got := e.logs(ctx, name); got != want {
				t.Errorf("build %d, step %s printed %q, want %q (the resource and its own cache only)", build, step, got, want)
			}
		}
	}
}

// concourseCache names a Concourse cache: a kind prefix, a readable part,
// and a hash of what identifies it, within a DNS label's 63 characters.
func concourseCache(kind, readable string, identity ...string) string {
	h := sha256.New()
	for _, s := range identity {
		fmt.Fprintf(h, "%d:%s;", len(s), s)
	}
	name := kind + "-" + readable
	return name[:min(len(name), 50)] + "-" + hex.EncodeToString(h.Sum(nil))[:12]
}

// concourseTask is a task step's pod: the resource's cache read-only at
// /input, the task's own cache at /cache.
func (e *env) concourseTask(name, resource, cache, script string) *corev1.Pod {
	pod := e.cachePod(name, cacheAnnotations(cache, v1alpha1.AnnotationCommit, string(v1alpha1.CommitAlways)), script)
	input := cacheVolume(cacheAnnotations(resource, v1alpha1.AnnotationMode, string(v1alpha1.ModeRead)))
	input.Name = "input"
	pod.Spec.Volumes = append(pod.Spec.Volumes, input)
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "input", MountPath: "/input"})
	return pod
}
