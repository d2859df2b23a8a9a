package bench

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// System is a system under test.
type System string

const (
	Layercache System = "layercache"
	LocalPath  System = "local-path"
)

// Systems in the order the runs alternate.
var Systems = []System{Layercache, LocalPath}

// short names the system in pod names.
func (s System) short() string {
	if s == Layercache {
		return "lc"
	}
	return "lp"
}

// Images and the pod and volume layout of the workload.
const (
	ImageBusybox = "localhost/busybox:e2e"
	// ContainerName is the build pods' only container.
	ContainerName = "main"
	// CacheMount is where the build pod sees its cache volume.
	CacheMount = "/cache"
	// StoreMount is where a local-path pod sees the cache store.
	StoreMount = "/store"
	// claimSize is requested by every claim; neither system enforces it.
	claimSize = "8Gi"
)

// Seed is the content a cache starts with: Files files holding Bytes
// bytes in total (sizes differ by at most one byte) in seedDirs
// directories, and a file seed.done. The zero Seed is an empty cache.
type Seed struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// NewSeed checks that files and bytes make a seed the generator can write.
func NewSeed(files int, bytes int64) (Seed, error) {
	if files < seedDirs || files%seedDirs != 0 {
		return Seed{}, fmt.Errorf("BENCH_BIG_FILES=%d: want a positive multiple of %d (the files are spread over %d directories), e.g. 50000", files, seedDirs, seedDirs)
	}
	if bytes < int64(files) || bytes > 64<<30 {
		return Seed{}, fmt.Errorf("BENCH_BIG_BYTES=%d: want at least one byte per file (%d) and at most 64Gi, e.g. 1Gi", bytes, files)
	}
	return Seed{Files: files, Bytes: bytes}, nil
}

// Empty reports whether the seed writes nothing.
func (s Seed) Empty() bool { return s.Files == 0 }

// Case is one cache state the benchmark measures.
type Case struct {
	// Name is a DNS label, part of pod and cache names.
	Name  string `json:"name"`
	Title string `json:"title"`
	Seed  Seed   `json:"seed"`
}

// Shared reports whether the runs of the case share one cache: the seeded
// cache grows run by run, as consecutive builds do; runs on an empty cache
// each get a new one.
func (c Case) Shared() bool { return !c.Seed.Empty() }

// CacheName is the layercache cache of a run.
func (c Case) CacheName(run int) string {
	if c.Shared() {
		return "bench-" + c.Name
	}
	return fmt.Sprintf("bench-%s-%d", c.Name, run)
}

// StoreClaim is the local-path claim that holds the case's cache store.
func (c Case) StoreClaim() string { return "store-" + c.Name }

// StoreDir is the directory in the store that a local-path run copies
// from and back to.
func (c Case) StoreDir(run int) string {
	if c.Shared() {
		return StoreMount + "/cache"
	}
	return fmt.Sprintf("%s/run-%d", StoreMount, run)
}

// Expect lists the paths a run must find in its warm cache: the seed's
// marker and the output of the run before it.
func (c Case) Expect(run int) []string {
	if !c.Shared() {
		return nil
	}
	paths := []string{"seed.done"}
	if run > 0 {
		paths = append(paths, fmt.Sprintf("runs/%d", run-1))
	}
	return paths
}

// PodName is the build pod of a run.
func PodName(s System, c Case, run int) string {
	return fmt.Sprintf("%s-%s-%d", s.short(), c.Name, run)
}

// SeedPodName is the pod that seeds the case's cache for system s.
func SeedPodName(s System, c Case) string {
	return fmt.Sprintf("%s-%s-seed", s.short(), c.Name)
}

// NextPodName is the pod that names the cache of a run's build pod right
// after that pod ended.
func NextPodName(s System, c Case, run int) string {
	return PodName(s, c, run) + "-next"
}

// ClaimName is the generic ephemeral volume claim of a pod's cache volume,
// named as Kubernetes names it: POD-VOLUME.
func ClaimName(pod string) string { return pod + "-cache" }

// scriptStart begins both build scripts: it marks the start, copies the
// cache in from the store for local-path (BENCH_STORE), and marks the
// build as ready.
const scriptStart = `set -eu
mark() { echo "BENCH $1 $(echo | ts %.s)"; }
mark ` + MarkStart + `
if [ -n "${BENCH_STORE:-}" ]; then
	mkdir -p "$BENCH_STORE"
	cp -a "$BENCH_STORE/." ` + CacheMount + `/
fi
mark ` + MarkReady + `
`

// Script is the build: make the cache warm, build, commit (see the package
// documentation). It prints the markers that ParseMarkers reads; busybox's
// date has no sub-second format, ts has. Environment: BENCH_RUN, and for
// local-path BENCH_STORE (the store directory); BENCH_EXPECT lists paths
// the warm cache must hold.
const Script = scriptStart + `for f in ${BENCH_EXPECT:-}; do
	if [ ! -e "` + CacheMount + `/$f" ]; then
		echo "BENCH-ERROR the cache is not warm: ` + CacheMount + `/$f is missing"
		exit 1
	fi
done
out=` + CacheMount + `/runs/$BENCH_RUN
mkdir -p "$out"
head -c 1048576 /dev/urandom > "$out/output.bin"
i=0
while [ "$i" -lt 100 ]; do
	echo "run $BENCH_RUN object $i" > "$out/object-$i"
	i=$((i + 1))
done
mark ` + MarkBuilt + `
if [ -n "${BENCH_STORE:-}" ]; then
	cp -a -u ` + CacheMount + `/. "$BENCH_STORE/"
	mark ` + MarkCopied + `
	sync -f "$BENCH_STORE"
	mark ` + MarkCommitted + `
fi
`

// NextScript is the start of the build after a run's build: make the cache
// warm as Script does, then check that it holds the output of the build
// before (BENCH_PREV, a path under the cache) and print MarkWarm, or
// MarkStale if it does not. It exits 0 either way: a stale cache is a
// result, counted, not a failure of the benchmark.
const NextScript = scriptStart + `if [ -e "` + CacheMount + `/$BENCH_PREV/output.bin" ]; then
	mark ` + MarkWarm + `
else
	mark ` + MarkStale + `
	echo "BENCH-STALE ` + CacheMount + `/$BENCH_PREV/output.bin is missing"
fi
`

// SeedScript writes a seed into BENCH_SEED_DIR: BENCH_SEED_FILES files
// holding BENCH_SEED_BYTES bytes in BENCH_SEED_DIRS directories, written by
// one awk process (a process per file would take minutes), then seed.done,
// then syncs, so that the runs do not pay for the seed's writeback. It
// prints "BENCH-SEED files=N" with the files it finds afterwards.
const SeedScript = `set -eu
mkdir -p "$BENCH_SEED_DIR"
if [ "$BENCH_SEED_FILES" -gt 0 ]; then
	awk -v root="$BENCH_SEED_DIR" -v files="$BENCH_SEED_FILES" -v bytes="$BENCH_SEED_BYTES" -v dirs="$BENCH_SEED_DIRS" 'BEGIN {
		per = files / dirs
		base = int(bytes / files)
		rem = bytes - base * files
		s = "0123456789abcdef"
		while (length(s) < base + 1) s = s s
		n = 0
		for (d = 0; d < dirs; d++) {
			dir = sprintf("%s/d%02d", root, d)
			if (system("mkdir -p " dir) != 0) exit 1
			for (i = 0; i < per; i++) {
				f = sprintf("%s/f%05d", dir, i)
				printf "%s", substr(f "\n" s, 1, base + (n < rem ? 1 : 0)) > f
				close(f)
				n++
			}
		}
	}'
	echo "$BENCH_SEED_FILES files, $BENCH_SEED_BYTES bytes" > "$BENCH_SEED_DIR/seed.done"
fi
sync -f "$BENCH_SEED_DIR"
echo "BENCH-SEED files=$(find "$BENCH_SEED_DIR" -type f | wc -l)"
`

// SeedFiles is what SeedScript's count must say for seed s: its files and
// seed.done.
func SeedFiles(s Seed) int {
	if s.Empty() {
		return 0
	}
	return s.Files + 1
}

// RunPod is the build pod of one run: the same for both systems but for the
// cache volume's class and annotation, and the store that local-path copies
// from and back to.
func RunPod(s System, c Case, run int, node string) *corev1.Pod {
	env := []corev1.EnvVar{
		{Name: "BENCH_RUN", Value: strconv.Itoa(run)},
		{Name: "BENCH_EXPECT", Value: strings.Join(c.Expect(run), " ")},
	}
	return buildPod(s, c, run, node, PodName(s, c, run), Script, env)
}

// NextPod is the next build's pod after a run's build pod: the same cache
// (and, for local-path, the same store directory), so it must find the
// run's output, runs/RUN.
func NextPod(s System, c Case, run int, node string) *corev1.Pod {
	env := []corev1.EnvVar{{Name: "BENCH_PREV", Value: "runs/" + strconv.Itoa(run)}}
	return buildPod(s, c, run, node, NextPodName(s, c, run), NextScript, env)
}

// buildPod runs script with the run's cache at /cache and, for local-path,
// the case's store and the run's store directory.
func buildPod(s System, c Case, run int, node, name, script string, env []corev1.EnvVar) *corev1.Pod {
	if s == LocalPath {
		env = append(env, corev1.EnvVar{Name: "BENCH_STORE", Value: c.StoreDir(run)})
	}
	pod := benchPod(name, node, script, env)
	addCacheVolume(pod, s, c.CacheName(run))
	if s == LocalPath {
		addStoreVolume(pod, c)
	}
	return pod
}

// SeedPod writes the case's seed: for layercache into a volume of the
// case's cache, which is committed when the pod succeeds; for local-path
// into the store. On an empty case it only makes the store's claim bound,
// so that no measured run waits for it.
func SeedPod(s System, c Case, node string) *corev1.Pod {
	dir := CacheMount
	if s == LocalPath {
		dir = StoreMount
		if c.Shared() {
			dir = c.StoreDir(0)
		}
	}
	env := []corev1.EnvVar{
		{Name: "BENCH_SEED_DIR", Value: dir},
		{Name: "BENCH_SEED_FILES", Value: strconv.Itoa(c.Seed.Files)},
		{Name: "BENCH_SEED_BYTES", Value: strconv.FormatInt(c.Seed.Bytes, 10)},
		{Name: "BENCH_SEED_DIRS", Value: strconv.Itoa(seedDirs)},
	}
	pod := benchPod(SeedPodName(s, c), node, SeedScript, env)
	if s == Layercache {
		addCacheVolume(pod, s, c.CacheName(0))
	} else {
		addStoreVolume(pod, c)
	}
	return pod
}

// StoreClaim is the long-lived local-path claim that holds a case's cache
// store, as a user of a copy-based cache keeps one.
func StoreClaim(c Case) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.StoreClaim()},
		Spec:       claimSpec(PeerStorageClass),
	}
}

func benchPod(name, node, script string, env []corev1.EnvVar) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(1)),
			// A node selector, not spec.nodeName: the scheduler must run, or
			// a WaitForFirstConsumer claim is never provisioned.
			NodeSelector: map[string]string{corev1.LabelHostname: node},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           ImageBusybox,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sh", "-c", script},
				Env:             env,
			}},
		},
	}
}

func claimSpec(class string) corev1.PersistentVolumeClaimSpec {
	return corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		StorageClassName: &class,
		Resources: corev1.VolumeResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(claimSize)},
		},
	}
}

// addCacheVolume gives the pod a generic ephemeral volume at CacheMount.
func addCacheVolume(pod *corev1.Pod, s System, cache string) {
	tmpl := &corev1.PersistentVolumeClaimTemplate{Spec: claimSpec(PeerStorageClass)}
	if s == Layercache {
		tmpl.Spec = claimSpec(v1alpha1.StorageClassName)
		tmpl.Annotations = map[string]string{v1alpha1.AnnotationCache: cache}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
		Name:         "cache",
		VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: tmpl}},
	})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "cache", MountPath: CacheMount})
}

// addStoreVolume mounts the case's store claim at StoreMount.
func addStoreVolume(pod *corev1.Pod, c Case) {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
		Name: "store",
		VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
			ClaimName: c.StoreClaim(),
		}},
	})
	ctr := &pod.Spec.Containers[0]
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "store", MountPath: StoreMount})
}
