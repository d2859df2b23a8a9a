//go:build e2e && multinode

package multinode

import (
	"context"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

// lazyCacheMiB is the cache TestFreshNodeMountsFirst publishes, in 1 MiB
// files: large enough that fetching it whole would show in a pod's start
// (about 1 s per 256 MiB here), small enough for CI's budget. LAZY_E2E_MIB
// sets another size (docs/performance.md, "Mount first", has 256 and 1024).
func lazyCacheMiB(t *testing.T) int {
	s := os.Getenv("LAZY_E2E_MIB")
	if s == "" {
		return 256
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("LAZY_E2E_MIB=%q: want a number of MiB, such as 1024", s)
	}
	return n
}

// maxFreshOverWarm bounds a fresh node's pod start over a warm node's.
// The target is 1.5x (measured 1.34x at 1 GiB); the margin keeps
// a loaded CI machine's noise from failing the run.
const maxFreshOverWarm = 2.0

// TestFreshNodeMountsFirst: a cache published from node A is mounted on
// node B, which never held it, before its bytes are there. A pod that
// reads one small file of it starts within maxFreshOverWarm of the same
// pod on node A; B's replica shows the layer filling until its copy is
// complete, and then a pod on B reads every file as A wrote it.
func TestFreshNodeMountsFirst(t *testing.T) {
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	mib := lazyCacheMiB(t)

	write := fmt.Sprintf(`mkdir -p /cache/data; for i in $(seq %d); do head -c 1048576 /dev/urandom > /cache/data/$i; done
echo hello > /cache/small.txt; cd /cache/data && md5sum * | md5sum | cut -d' ' -f1 > /cache/sums`, mib)
	e.run(ctx, withRequest(e.buildPod("write", a, "big", "", write), mib))
	e.waitPublishedIn(ctx, "big", 1, publishTimeout+time.Duration(mib/256)*time.Minute)

	read := "cat /cache/small.txt"
	fresh := e.timedRun(ctx, withRequest(e.buildPod("read-fresh", b, "big", "", read), mib))
	warm := e.timedRun(ctx, withRequest(e.buildPod("read-warm", a, "big", "", read), mib))
	ratio := fresh.Seconds() / warm.Seconds()
	t.Logf("%d MiB cache, a pod reading one small file, create -> Succeeded: node %s (fresh) %s, node %s (warm) %s: %.2fx",
		mib, b, fresh.Round(time.Millisecond), a, warm.Round(time.Millisecond), ratio)
	if ratio > maxFreshOverWarm {
		t.Errorf("the pod on the fresh node took %.2fx the warm node's, want at most %.1fx: the layer was not mounted before its bytes were there", ratio, maxFreshOverWarm)
	}

	e.waitFilled(ctx, "big", b)
	out := e.run(ctx, withRequest(e.buildPod("check", b, "big", "", "cd /cache/data && md5sum * | md5sum | cut -d' ' -f1; cat /cache/sums"), mib))
	if sums := strings.Fields(out); len(sums) != 2 || sums[0] != sums[1] {
		t.Errorf("node %s's copy of the %d files: checksums %q, want them equal to node %s's", b, mib, sums, a)
	}
}

// withRequest makes pod's claim ask for room for mib MiB and more: the
// claim's request bounds the layers its build commits, publishes and
// pulls (maxLayerSize's default), and buildPod asks for 2 GiB.
func withRequest(pod *corev1.Pod, mib int) *corev1.Pod {
	want := resource.MustParse(fmt.Sprintf("%dMi", mib+mib/4+512))
	spec := &pod.Spec.Volumes[0].Ephemeral.VolumeClaimTemplate.Spec
	if want.Cmp(spec.Resources.Requests[corev1.ResourceStorage]) > 0 {
		spec.Resources.Requests[corev1.ResourceStorage] = want
	}
	return pod
}

// timedRun runs pod and returns how long it
// took from create to Succeeded, as the user sees it.
func (e *syncEnv) timedRun(ctx context.Context, pod *corev1.Pod) time.Duration {
	e.t.Helper()
	start := time.Now()
	e.run(ctx, pod)
	return time.Since(start)
}

// waitPublishedIn is waitPublished with its own bound.
func (e *syncEnv) waitPublishedIn(ctx context.Context, name string, gen int64, timeout time.Duration) {
	e.t.Helper()
	e.waitCache(ctx, name, timeout, fmt.Sprintf("publication of generation %d", gen), func(c *v1alpha1.Cache) bool {
		return c.Status.Published != nil && c.Status.Published.Generation >= gen
	})
}

// waitFilled waits until node's replica of cache shows that it held a
// layer filling and then no more: the copy completed in the background.
func (e *syncEnv) waitFilled(ctx context.Context, cache, node string) {
	e.t.Helper()
	c, err := e.cache(ctx, cache)
	if err != nil {
		e.t.Fatal(err)
	}
	var last any
	err = wait.PollUntilContextTimeout(ctx, pollInterval, 2*time.Minute, true, func(context.Context) (bool, error) {
		st := e.nodeEntry(c, node)
		if st == nil {
			return false, nil
		}
		last = *st
		return st.Filling == 0, nil
	})
	if err != nil {
		e.t.Fatalf("node %s's replica of cache %s still shows layers filling after 2m: %+v", node, cache, last)
	}
}

// wholePullClass copies the registry's class with mountFirst "false": a
// node fetches whole layers before a volume is ready, as before mount
// first. It is deleted with the test.
func (e *syncEnv) wholePullClass(ctx context.Context) string {
	e.t.Helper()
	return e.derivedClass(ctx, "whole-pull", map[string]string{"mountFirst": "false"})
}

// derivedClass copies the registry's class as NAMESPACE-suffix with
// params changed; it is deleted with the test.
func (e *syncEnv) derivedClass(ctx context.Context, suffix string, params map[string]string) string {
	e.t.Helper()
	merged := maps.Clone(e.registryStorageClass(ctx).Parameters)
	maps.Copy(merged, params)
	return e.newClass(ctx, suffix, merged)
}

func (e *syncEnv) registryStorageClass(ctx context.Context) *storagev1.StorageClass {
	e.t.Helper()
	base, err := e.Client.StorageV1().StorageClasses().Get(ctx, e.Reg.StorageClass, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return base
}

// newClass creates the class NAMESPACE-suffix of the registry class's
// provisioner, binding mode and reclaim policy, with params; it is
// deleted with the test.
func (e *syncEnv) newClass(ctx context.Context, suffix string, params map[string]string) string {
	e.t.Helper()
	base := e.registryStorageClass(ctx)
	class := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: e.Namespace + "-" + suffix},
		Provisioner:       base.Provisioner,
		Parameters:        params,
		VolumeBindingMode: base.VolumeBindingMode,
		ReclaimPolicy:     base.ReclaimPolicy,
	}
	if _, err := e.Client.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		e.Client.StorageV1().StorageClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	return class.Name
}

// goBuildScript compiles testdata/hello (framework.CreateHelloSource)
// with GOCACHE and GOMODCACHE on the cache as framework.BuildUID, and
// prints how many files GOCACHE held before and how many packages the go
// command compiled (go build -x lists a compile per package it builds).
const goBuildScript = `test "$(id -u)" = 1000
rm -rf /cache/src; mkdir -p /cache/src; cp /source/main.go /source/go.mod /source/go.sum /cache/src/; cd /cache/src
find "$GOCACHE" -type f 2>/dev/null | wc -l
go build -x -o /tmp/hello . 2>&1 | grep -c '/compile ' || true
/tmp/hello --name fresh`

// goBuildPod is buildPod with the Go toolchain, the module proxy and the
// source mounted, run as framework.BuildUID.
func (e *syncEnv) goBuildPod(name, node, cache, class string) *corev1.Pod {
	goroot, downloads := framework.GoPaths(e.t)
	pod := e.buildPod(name, node, cache, class, goBuildScript)
	uid := int64(framework.BuildUID)
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: ptr(true)}
	dir := corev1.HostPathDirectory
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: "source", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "hello-src"}}}},
		corev1.Volume{Name: "goroot", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: goroot, Type: &dir}}},
		corev1.Volume{Name: "goproxy", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: downloads, Type: &dir}}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: "source", MountPath: "/source"},
		corev1.VolumeMount{Name: "goroot", MountPath: "/usr/local/go", ReadOnly: true},
		corev1.VolumeMount{Name: "goproxy", MountPath: "/goproxy", ReadOnly: true})
	for k, v := range map[string]string{
		"PATH": "/usr/local/go/bin:/bin:/usr/bin", "HOME": "/tmp", "GOCACHE": "/cache/go-build", "GOMODCACHE": "/cache/go-mod",
		"GOPROXY": "file:///goproxy", "GOSUMDB": "off", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "GOTELEMETRY": "off", "CGO_ENABLED": "0",
	} {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
	}
	return pod
}

func ptr[T any](v T) *T { return &v }

// TestWarmGoBuildOnAFreshNode: a Go build on node A fills its cache
// (GOCACHE and GOMODCACHE), which is published; the same build on node
// B, which never held the cache, mounts it first and compiles nothing,
// as a warm build on A would, reading the cache's objects on demand.
func TestWarmGoBuildOnAFreshNode(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	e.CreateHelloSource(ctx, "hello-src")
	uid := strconv.Itoa(framework.BuildUID)
	class := e.derivedClass(ctx, "go-build", map[string]string{"uid": uid, "gid": uid, "mode": "0775"})

	cold := strings.Fields(e.runBuild(ctx, e.goBuildPod("cold", a, "gocache", class)))
	e.waitPublished(ctx, "gocache", 1)
	warm := strings.Fields(e.runBuild(ctx, e.goBuildPod("fresh", b, "gocache", class)))
	t.Logf("cold build on %s: %v (GOCACHE files before, packages compiled, output); on fresh node %s: %v", a, cold, b, warm)
	if len(cold) < 2 || cold[1] == "0" {
		t.Fatalf("the cold build on %s printed %q: want it to compile packages", a, cold)
	}
	if len(warm) < 3 || warm[0] == "0" || warm[1] != "0" || !strings.Contains(strings.Join(warm[2:], " "), "fresh") {
		t.Errorf("the build on fresh node %s printed %q: want a filled GOCACHE, no package compiled, and the program's greeting", b, warm)
	}
}
