package volumes

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// The tests in this file run Provision and Delete against a real layerfs
// store with real overlay mounts.

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: this test makes real overlay mounts; run `make test` as root")
	}
}

// newRealEnv is a node-a provisioner over a real store in a temp root;
// every mount under it is gone when the test ends.
func newRealEnv(t *testing.T, maxLayers int, objs ...client.Object) (*testEnv, *layerfs.Store) {
	t.Helper()
	st := openRealStore(t, maxLayers)
	return newTestEnv(t, st, objs...), st
}

// openRealStore opens a store in a temp root; every mount under it is
// gone when the test ends.
func openRealStore(t testing.TB, maxLayers int) *layerfs.Store {
	t.Helper()
	requireRoot(t)
	root := t.TempDir()
	st, err := layerfs.Open(context.Background(), layerfs.Options{Root: root, MaxLayers: maxLayers})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { unmountUnder(t, root) })
	// First: the store's background completions stop, so none settles a
	// layer (a mount) after the unmounts.
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("cleanup: close store: %v", err)
		}
	})
	return st
}

// unmountUnder unmounts every mount under root, deepest first: volumes,
// and the layers pulled as images, which are mounts of their own.
func unmountUnder(t testing.TB, root string) {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(root))
	if err != nil {
		t.Errorf("cleanup: read mounts: %v", err)
		return
	}
	slices.SortStableFunc(mounts, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("cleanup: unmount %s: %v", m.Mountpoint, err)
		}
	}
}

// provisionReal provisions a claim named name of namespace ns and returns
// its PV.
func provisionReal(t *testing.T, env *testEnv, ns, name string, ann, params map[string]string) *corev1.PersistentVolume {
	t.Helper()
	opts := provisionOptions(ns, ann, params)
	opts.PVC.Name, opts.PVC.UID = name, types.UID("0c5e7a38-6c2d-4a8e-9a1f-"+name)
	opts.PVName = "pvc-" + string(opts.PVC.UID)
	pv, state, err := env.prov.Provision(context.Background(), opts)
	if err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision %s/%s: %v, %v", ns, name, state, err)
	}
	return pv
}

// release deletes the PV's volume as the library does once the manager
// recorded the pod's outcome and the claim is gone.
func release(t *testing.T, env *testEnv, pv *corev1.PersistentVolume, outcome string) {
	t.Helper()
	if outcome != "" {
		pv.Annotations[v1alpha1.AnnotationPodOutcome] = outcome
	}
	pv.Status.Phase = corev1.VolumeReleased
	if err := env.prov.Delete(context.Background(), pv); err != nil {
		t.Fatalf("Delete %s: %v", pv.Name, err)
	}
}

func writeFile(t testing.TB, pv *corev1.PersistentVolume, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(pv.Spec.HostPath.Path, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantFile(t *testing.T, pv *corev1.PersistentVolume, name, content string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(pv.Spec.HostPath.Path, name))
	if err != nil {
		t.Fatalf("volume %s: %v", pv.Name, err)
	}
	if string(got) != content {
		t.Errorf("volume %s: %s = %q, want %q", pv.Name, name, got, content)
	}
}

func wantNoFile(t *testing.T, pv *corev1.PersistentVolume, name string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pv.Spec.HostPath.Path, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume %s: %s exists (err %v), want it absent", pv.Name, name, err)
	}
}

func wantGeneration(t *testing.T, st *layerfs.Store, ref layerfs.CacheRef, want int64) {
	t.Helper()
	info, err := st.Inspect(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if info.Generation != want {
		t.Errorf("cache %s at generation %d, want %d", ref, info.Generation, want)
	}
}

func TestRealCommitIsSeenByTheNextVolume(t *testing.T) {
	env, st := newRealEnv(t, 0)
	cacheAnn := map[string]string{v1alpha1.AnnotationCache: "maven"}

	first := provisionReal(t, env, "ci", "first", cacheAnn, nil)
	if fi, err := os.Stat(first.Spec.HostPath.Path); err != nil || !fi.IsDir() {
		t.Fatalf("PV path %s is not a directory: %v", first.Spec.HostPath.Path, err)
	}
	writeFile(t, first, "hello.txt", "from the first build")
	release(t, env, first, v1alpha1.OutcomeSucceeded)
	wantGeneration(t, st, maven, 1)
	if _, err := os.Stat(first.Spec.HostPath.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("committed volume's path still exists: %v", err)
	}

	second := provisionReal(t, env, "ci", "second", cacheAnn, nil)
	if got := second.Annotations[v1alpha1.AnnotationBaseGeneration]; got != "1" {
		t.Errorf("second volume's base generation %q, want 1", got)
	}
	wantFile(t, second, "hello.txt", "from the first build")
	writeFile(t, second, "broken.txt", "from a failed build")
	release(t, env, second, v1alpha1.OutcomeFailed)
	wantGeneration(t, st, maven, 1)

	third := provisionReal(t, env, "ci", "third", cacheAnn, nil)
	wantFile(t, third, "hello.txt", "from the first build")
	wantNoFile(t, third, "broken.txt")

	// Deleting twice (a retried PV deletion) is safe.
	release(t, env, third, v1alpha1.OutcomeSucceeded)
	release(t, env, third, v1alpha1.OutcomeSucceeded)
	if vols, _ := st.Volumes(context.Background()); len(vols) != 0 {
		t.Errorf("volumes left: %v", vols)
	}
}

func TestRealConcurrentVolumesBothLand(t *testing.T) {
	env, st := newRealEnv(t, 0)
	ann := map[string]string{v1alpha1.AnnotationCache: "maven"}
	a := provisionReal(t, env, "ci", "a", ann, nil)
	b := provisionReal(t, env, "ci", "b", ann, nil)
	writeFile(t, a, "a.txt", "a")
	writeFile(t, b, "b.txt", "b")
	release(t, env, a, v1alpha1.OutcomeSucceeded)
	release(t, env, b, v1alpha1.OutcomeSucceeded)
	wantGeneration(t, st, maven, 2)
	c := provisionReal(t, env, "ci", "c", ann, nil)
	wantFile(t, c, "a.txt", "a")
	wantFile(t, c, "b.txt", "b")
}

func TestRealVolumeRootOwnership(t *testing.T) {
	env, _ := newRealEnv(t, 0)
	pv := provisionReal(t, env, "ci", "owned", map[string]string{v1alpha1.AnnotationCache: "maven"},
		map[string]string{"uid": "1000", "gid": "1001", "mode": "0750"})
	fi, err := os.Stat(pv.Spec.HostPath.Path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 1000 || st.Gid != 1001 || fi.Mode().Perm() != 0o750 {
		t.Errorf("volume root %d:%d %o, want 1000:1001 750", st.Uid, st.Gid, fi.Mode().Perm())
	}
}

func TestRealReadViewsAreNeverCommitted(t *testing.T) {
	env, st := newRealEnv(t, 0, cacheObject("ci", "maven", "pr"))
	ctx := context.Background()
	seed := provisionReal(t, env, "ci", "seed", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	writeFile(t, seed, "trusted.txt", "trusted")
	release(t, env, seed, v1alpha1.OutcomeSucceeded)

	// A PR build of another namespace reads the cache; even under commit
	// always its writes stay out of the cache.
	pr := provisionReal(t, env, "pr", "pr-build", map[string]string{
		v1alpha1.AnnotationCache: "ci/maven", v1alpha1.AnnotationCommit: "always"}, nil)
	wantFile(t, pr, "trusted.txt", "trusted")
	writeFile(t, pr, "trusted.txt", "poisoned")
	release(t, env, pr, v1alpha1.OutcomeSucceeded)
	wantGeneration(t, st, maven, 1)

	check := provisionReal(t, env, "ci", "check", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	wantFile(t, check, "trusted.txt", "trusted")
	if _, err := st.Inspect(ctx, layerfs.CacheRef{Namespace: "pr", Name: "maven"}); !errors.Is(err, layerfs.ErrNotFound) {
		t.Errorf("a read of ci/maven created a cache in namespace pr: %v", err)
	}
}

func TestRealCommitOfBusyVolumeKeepsChanges(t *testing.T) {
	env, st := newRealEnv(t, 0)
	pv := provisionReal(t, env, "ci", "busy", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	writeFile(t, pv, "result.txt", "precious")
	f, err := os.Open(filepath.Join(pv.Spec.HostPath.Path, "result.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	pv.Annotations[v1alpha1.AnnotationPodOutcome] = v1alpha1.OutcomeSucceeded
	err = env.prov.Delete(context.Background(), pv)
	if !errors.Is(err, layerfs.ErrBusy) {
		t.Fatalf("Delete of a volume with an open file: %v, want a busy error that the library retries", err)
	}
	env.wantEvent(t, "Warning CommitFailed", "kept")
	wantFile(t, pv, "result.txt", "precious")
	wantGeneration(t, st, maven, 0)

	f.Close()
	release(t, env, pv, v1alpha1.OutcomeSucceeded)
	wantGeneration(t, st, maven, 1)
	next := provisionReal(t, env, "ci", "next", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	wantFile(t, next, "result.txt", "precious")
}

func TestRealRemountAfterReboot(t *testing.T) {
	env, st := newRealEnv(t, 0)
	ctx := context.Background()
	pv := provisionReal(t, env, "ci", "rebooted", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	writeFile(t, pv, "work.txt", "in progress")
	if err := unix.Unmount(pv.Spec.HostPath.Path, 0); err != nil {
		t.Fatal(err)
	}
	pv.Status.Phase = corev1.VolumeBound
	if n := remount(ctx, st, env.events, env.prov.metrics, "node-a", "", []*corev1.PersistentVolume{pv}); n != 1 {
		t.Fatalf("remounted %d volumes, want 1", n)
	}
	wantFile(t, pv, "work.txt", "in progress")
	// Provisioning the same claim again (the library retries after a
	// restart) returns the same mounted volume.
	again := provisionReal(t, env, "ci", "rebooted", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	wantFile(t, again, "work.txt", "in progress")
}

func TestRealSquashAfterDeepCommits(t *testing.T) {
	env, st := newRealEnv(t, 2)
	ann := map[string]string{v1alpha1.AnnotationCache: "maven"}
	for i, name := range []string{"one", "two", "three"} {
		pv := provisionReal(t, env, "ci", name, ann, nil)
		writeFile(t, pv, name+".txt", name)
		release(t, env, pv, v1alpha1.OutcomeSucceeded)
		if i < 2 && env.prov.squashes.Queue.Len() != 0 {
			t.Fatalf("squash queued at %d layers, below the limit", i+1)
		}
	}
	if env.prov.squashes.Queue.Len() != 1 {
		t.Fatal("no squash queued after the head passed the limit")
	}
	if err := env.maint.Squash(context.Background(), maven); err != nil {
		t.Fatal(err)
	}
	info, err := st.Inspect(context.Background(), maven)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Layers) != 1 || info.Generation != 3 {
		t.Errorf("after squash: %d layers at generation %d, want 1 layer at generation 3", len(info.Layers), info.Generation)
	}
	pv := provisionReal(t, env, "ci", "after", ann, nil)
	for _, name := range []string{"one", "two", "three"} {
		wantFile(t, pv, name+".txt", name)
	}
}

func TestRealDeletedCacheIsCleared(t *testing.T) {
	env, st := newRealEnv(t, 0)
	ctx := context.Background()
	pv := provisionReal(t, env, "ci", "seed", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	writeFile(t, pv, "x", "x")
	release(t, env, pv, v1alpha1.OutcomeSucceeded)

	// The user deletes the Cache; the manager's finalizer holds it.
	var cache v1alpha1.Cache
	if err := env.client.Get(ctx, clientKey(maven), &cache); err != nil {
		t.Fatal(err)
	}
	cache.Finalizers = []string{v1alpha1.FinalizerCleanup}
	if err := env.client.Update(ctx, &cache); err != nil {
		t.Fatal(err)
	}
	if err := env.client.Delete(ctx, &cache); err != nil {
		t.Fatal(err)
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ci", Name: "maven"}}
	if _, err := env.maint.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Inspect(ctx, maven); !errors.Is(err, layerfs.ErrNotFound) {
		t.Errorf("cache still on the node after its Cache was deleted: %v", err)
	}
}
