//go:build e2e

package imagebuild

import (
	"context"
	"strings"
	"testing"

	"github.com/layercache/layercache/api/v1alpha1"
)

// twoBuilds runs the build in a pod on class, waits until the node agent
// committed its volume, then runs it again in a second pod naming the
// same cache, and returns both runs. Both times are logged.
func (e *env) twoBuilds(ctx context.Context, class string) (first, second buildRun) {
	e.t.Helper()
	e.pvs = e.WatchPVs(ctx)
	const cache = "buildkit"
	first = e.build(ctx, "build-1", class, cache)
	e.waitCommitted(ctx, first.Pod, cache, 1)
	second = e.build(ctx, "build-2", class, cache)
	e.t.Logf("BuildKit on StorageClass %s (a volume of type %s, snapshotter %s): first build %.2fs, second build %.2fs (%.1fx faster)",
		class, first.Volume, first.Snapshotter, first.Seconds, second.Seconds, first.Seconds/second.Seconds)
	for _, r := range []buildRun{first, second} {
		for _, s := range r.Steps {
			e.t.Logf("  %s: %s cached=%v done=%s", r.Pod, s.Name, s.Cached, s.Done)
		}
	}
	return first, second
}

// checkWarm checks that the second build took every step from the cache
// the first left on the volume, and was at least speedup times faster.
func checkWarm(t *testing.T, first, second buildRun) {
	t.Helper()
	if !first.hasStep("RUN ") || !first.hasStep("COPY ") {
		t.Fatalf("the first build's progress shows steps %+v, want the Dockerfile's RUN and COPY; its output:\n%s", first.Steps, first.Build)
	}
	if got := first.uncached(); len(got) != len(first.Steps) {
		t.Errorf("the first build, on an empty cache, took steps from a cache: it ran only %q of %+v", got, first.Steps)
	}
	if len(second.Steps) != len(first.Steps) {
		t.Errorf("the second build shows steps %+v, want those of the first: %+v", second.Steps, first.Steps)
	}
	if got := second.uncached(); len(got) > 0 {
		t.Errorf("the second build ran %q again instead of taking them from BuildKit's cache on the volume; its output:\n%s", got, second.Build)
	}
	if second.Seconds*speedup > first.Seconds {
		t.Errorf("the second build took %.2fs, the first %.2fs: want it at least %dx faster", second.Seconds, first.Seconds, speedup)
	}
	if first.ImageBytes == 0 || second.ImageBytes == 0 {
		t.Errorf("exported images of %d and %d bytes, want an OCI archive from each build", first.ImageBytes, second.ImageBytes)
	}
}

// TestBuildKitCacheOnSnapshotVolume is the recipe of docs/image-builders.md:
// buildkitd's state on a volume of the snapshot layout, where it can use
// its overlayfs snapshotter as on a host directory. The second pod's build
// takes every step from the cache the first pod's left.
//
// A node agent without the snapshot layout refuses the class's layout
// parameter, which the failure names.
func TestBuildKitCacheOnSnapshotVolume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	e.requireSnapshotClass(ctx)

	first, second := e.twoBuilds(ctx, snapshotClass)
	for _, r := range []buildRun{first, second} {
		if r.Volume != "btrfs" {
			t.Errorf("the cache volume of %s is of type %q in the pod, want btrfs (a snapshot)", r.Pod, r.Volume)
		}
		if r.Snapshotter != "overlayfs" {
			t.Errorf("buildkitd of %s chose the %q snapshotter on the snapshot volume, want overlayfs; its log:\n%s", r.Pod, r.Snapshotter, r.Daemon)
		}
	}
	checkWarm(t, first, second)
}

// TestBuildKitOnOverlayVolume pins what BuildKit does today on the default
// overlay layout. The kernel refuses an overlayfs upper directory on an
// overlayfs ("overlay: filesystem on ... not supported as upperdir"), so
// buildkitd's automatic choice finds overlayfs unusable (and no
// fuse-overlayfs) and falls back to its native snapshotter, which makes
// each snapshot a full copy of its parent. The builds work and the cache
// survives in the volume's layers, so the second build is warm too; what
// the overlay layout costs is the copying (tiny for busybox, the size of
// the image at every step for real ones) and every copy landing in the
// cache's layers. If this test starts failing on the snapshotter,
// BuildKit or the kernel changed: update docs/image-builders.md with it.
func TestBuildKitOnOverlayVolume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()

	first, second := e.twoBuilds(ctx, v1alpha1.StorageClassName)
	for _, r := range []buildRun{first, second} {
		if r.Volume != "overlay" {
			t.Errorf("the cache volume of %s is of type %q in the pod, want overlay (the default layout)", r.Pod, r.Volume)
		}
		if r.Snapshotter != "native" {
			t.Errorf("buildkitd of %s chose the %q snapshotter on an overlay volume, want native (the fallback); its log:\n%s", r.Pod, r.Snapshotter, r.Daemon)
		}
		if !strings.Contains(r.Daemon, "auto snapshotter: using native") {
			t.Errorf("buildkitd of %s did not log its fallback to native (\"auto snapshotter: using native\"); its log:\n%s", r.Pod, r.Daemon)
		}
	}
	checkWarm(t, first, second)
}
