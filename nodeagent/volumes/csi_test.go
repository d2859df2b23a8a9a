package volumes

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

// The tests in this file drive the CSI Node service as the kubelet does,
// against a real store with real overlay and bind mounts.

// csiEnv is a CSI driver of node-a over a real store, with the pods the
// API server has (the informer's and a GET's answer are the same here).
type csiEnv struct {
	*testEnv
	store      *layerfs.Store
	driver     *csiDriver
	ends       *csiEnds
	pods       cache.Indexer
	kubeletDir string
}

// testCSILimits are the node agent's defaults (--csi-default-size,
// --csi-max-size).
var testCSILimits = kit.CSILimits{Default: 10 << 30, Max: 100 << 30}

// newCSIEnv's pods are of namespace ci, which has opted in to CSI
// volumes. The StorageClasses among objs are the agent's informer's, the
// rest the API's.
func newCSIEnv(t *testing.T, objs ...client.Object) *csiEnv {
	t.Helper()
	ci := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ci", Labels: map[string]string{v1alpha1.LabelCSI: v1alpha1.CSIEnabled}}}
	st := openRealStore(t, 8)
	classes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	apiObjs := []client.Object{ci}
	for _, o := range objs {
		if class, ok := o.(*storagev1.StorageClass); ok {
			if err := classes.Add(class); err != nil {
				t.Fatal(err)
			}
			continue
		}
		apiObjs = append(apiObjs, o)
	}
	c := newCacheClient(t, apiObjs...)
	events := events.NewFakeRecorder(100)
	parts := testNodeParts(t, "node-a", "", st, c, events)
	parts.core.Classes = storagelisters.NewStorageClassLister(classes)
	parts.sync.Classes = parts.core.Classes
	parts.core.KubeletDir = t.TempDir()
	pods := parts.core.Pods.GetIndexer()
	parts.core.GetPod = func(_ context.Context, ns, name string) (*corev1.Pod, error) {
		obj, ok, _ := pods.GetByKey(ns + "/" + name)
		if !ok {
			return nil, apierrors.NewNotFound(corev1.Resource("pods"), name)
		}
		return obj.(*corev1.Pod), nil
	}
	env := newTestEnvOf(t, parts, c, events)
	e := &csiEnv{testEnv: env, store: st, kubeletDir: parts.core.KubeletDir, pods: pods, driver: env.core.csi, ends: env.core.csiEnds}
	t.Cleanup(func() { unmountUnder(t, e.kubeletDir) })
	return e
}

// csiPodObject is a pod of namespace ci with a layercache CSI volume.
func csiPodObject(name string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "build"}},
			Volumes: []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
				CSI: &corev1.CSIVolumeSource{Driver: v1alpha1.CSIDriverName}}}},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// setPod is what the API server (and the informer) say of the pod now.
func (e *csiEnv) setPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := e.pods.Update(pod); err != nil {
		t.Fatal(err)
	}
}

func (e *csiEnv) target(pod string) string { return csiTarget(e.kubeletDir, pod) }

func (e *csiEnv) publishRequest(pod string, attrs map[string]string) *csi.NodePublishVolumeRequest {
	return csiPublishRequest(e.kubeletDir, pod, attrs)
}

// csiTarget is where the kubelet of kubeletDir publishes pod's volume.
func csiTarget(kubeletDir, pod string) string {
	return filepath.Join(kubeletDir, "pods", "uid-"+pod, "volumes", "kubernetes.io~csi", "cache", "mount")
}

// csiPublishRequest is the kubelet's request to publish the volume of pod
// of namespace ci, with attrs.
func csiPublishRequest(kubeletDir, pod string, attrs map[string]string) *csi.NodePublishVolumeRequest {
	ctx := map[string]string{
		kit.AttrPodNamespace: "ci", kit.AttrPodName: pod, kit.AttrPodUID: "uid-" + pod,
		kit.AttrServiceAccount: "default", kit.AttrEphemeral: "true",
	}
	for k, v := range attrs {
		ctx[k] = v
	}
	return &csi.NodePublishVolumeRequest{
		VolumeId: "csi-" + pod, TargetPath: csiTarget(kubeletDir, pod), VolumeContext: ctx,
		VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
	}
}

// publish publishes pod's volume and returns its target, checked mounted.
func (e *csiEnv) publish(t *testing.T, pod string, attrs map[string]string) string {
	t.Helper()
	if _, err := e.driver.NodePublishVolume(context.Background(), e.publishRequest(pod, attrs)); err != nil {
		t.Fatalf("publish %s: %v", pod, err)
	}
	target := e.target(pod)
	if mounted, err := mountinfo.Mounted(target); err != nil || !mounted {
		t.Fatalf("target %s mounted = %v, %v", target, mounted, err)
	}
	return target
}

func (e *csiEnv) unpublish(t *testing.T, pod string) {
	t.Helper()
	_, err := e.driver.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-" + pod, TargetPath: e.target(pod)})
	if err != nil {
		t.Fatalf("unpublish %s: %v", pod, err)
	}
	if _, err := os.Stat(e.target(pod)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target of %s after unpublish: %v, want it removed", pod, err)
	}
}

// volumeOpen tells whether pod's volume is still in the store (not ended).
func (e *csiEnv) volumeOpen(t *testing.T, pod string) bool {
	t.Helper()
	_, err := e.store.Volume(context.Background(), csiStoreID("csi-"+pod))
	if err != nil && !errors.Is(err, layerfs.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func (e *csiEnv) generation(t *testing.T, name string) int64 {
	t.Helper()
	info, err := e.store.Inspect(context.Background(), layerfs.CacheRef{Namespace: "ci", Name: name})
	if errors.Is(err, layerfs.ErrNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return info.Generation
}

func TestCSIVolumeEndsAsItsPod(t *testing.T) {
	tests := []struct {
		name  string
		attrs map[string]string
		// phase is the pod's at unpublish; "" means the pod is gone.
		phase      corev1.PodPhase
		marker     bool
		readOnly   bool
		wantCommit bool
		wantEvent  string
	}{
		{name: "succeeded commits", phase: corev1.PodSucceeded, wantCommit: true, wantEvent: "Normal Committed"},
		{name: "failed discards", phase: corev1.PodFailed, wantEvent: "Normal Discarded"},
		{name: "gone pod's outcome is unknown: discarded", phase: "", wantEvent: "Normal Discarded"},
		{name: "always commits a gone pod's volume", attrs: map[string]string{kit.AttrCommit: "always"}, phase: "", wantCommit: true, wantEvent: "Normal Committed"},
		{name: "never discards", attrs: map[string]string{kit.AttrCommit: "never"}, phase: corev1.PodSucceeded, wantEvent: "Normal Discarded"},
		{name: "on-marker with the marker commits a failed pod", attrs: map[string]string{kit.AttrCommit: "on-marker"}, phase: corev1.PodFailed, marker: true, wantCommit: true, wantEvent: "Normal Committed"},
		{name: "on-marker without it discards", attrs: map[string]string{kit.AttrCommit: "on-marker"}, phase: corev1.PodSucceeded, wantEvent: "Normal Discarded"},
		{name: "read mode discards", attrs: map[string]string{kit.AttrMode: "read"}, phase: corev1.PodSucceeded, wantEvent: "Normal Discarded"},
		{name: "a read-only mount is a read view", readOnly: true, phase: corev1.PodSucceeded, wantEvent: "Normal Discarded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCSIEnv(t)
			e.setPod(t, csiPodObject("build", corev1.PodRunning))
			attrs := map[string]string{kit.AttrCache: "maven"}
			for k, v := range tt.attrs {
				attrs[k] = v
			}
			req := e.publishRequest("build", attrs)
			req.Readonly = tt.readOnly
			if _, err := e.driver.NodePublishVolume(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			target := e.target("build")
			if !tt.readOnly {
				writeTestFile(t, filepath.Join(target, "built.txt"), "yes")
				if tt.marker {
					writeTestFile(t, filepath.Join(target, layerfs.ControlDir, v1alpha1.MarkerCommit), "")
				}
			} else if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err == nil {
				t.Error("a read-only CSI mount took a write")
			}
			e.drainEvents()
			if tt.phase == "" {
				if err := e.pods.Delete(csiPodObject("build", "")); err != nil {
					t.Fatal(err)
				}
			} else {
				e.setPod(t, csiPodObject("build", tt.phase))
			}
			e.unpublish(t, "build")
			if e.volumeOpen(t, "build") {
				t.Fatal("the volume is still open after its pod's unpublish")
			}
			if got := e.generation(t, "maven") == 1; got != tt.wantCommit {
				t.Fatalf("committed = %v, want %v", got, tt.wantCommit)
			}
			e.wantEvent(t, tt.wantEvent)
			// The kubelet retries an unpublish it did not see answered:
			// nothing happens twice.
			e.unpublish(t, "build")
			if evs := e.drainEvents(); len(evs) != 0 {
				t.Errorf("a second unpublish recorded %q", evs)
			}
		})
	}
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The kubelet unpublishes as soon as the containers stop; the phase may
// come later. The pod watch then ends the volume, once.
func TestCSIVolumeEndsWhenThePhaseArrivesAfterUnpublish(t *testing.T) {
	ctx := context.Background()
	e := newCSIEnv(t)
	e.setPod(t, csiPodObject("build", corev1.PodRunning))
	target := e.publish(t, "build", map[string]string{kit.AttrCache: "maven"})
	writeTestFile(t, filepath.Join(target, "built.txt"), "yes")
	e.unpublish(t, "build")
	if !e.volumeOpen(t, "build") || e.generation(t, "maven") != 0 {
		t.Fatal("the volume ended before its pod's outcome was known")
	}
	e.setPod(t, csiPodObject("build", corev1.PodSucceeded))
	for range 2 { // the watch and a sweep: one commit
		if err := e.ends.sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if e.volumeOpen(t, "build") || e.generation(t, "maven") != 1 {
		t.Fatalf("after the phase: open %v, generation %d; want ended and committed once", e.volumeOpen(t, "build"), e.generation(t, "maven"))
	}
	e.wantEvent(t, "Normal Committed")
}

// The kubelet unpublished while the pod still showed running, then the pod
// went away and the kubelet removed its directory: the sweep ends the
// volume (its outcome unknown: discarded).
func TestCSIVolumeOfAPodGoneAfterUnpublishIsDiscarded(t *testing.T) {
	ctx := context.Background()
	e := newCSIEnv(t)
	e.setPod(t, csiPodObject("build", corev1.PodRunning))
	target := e.publish(t, "build", map[string]string{kit.AttrCache: "maven"})
	writeTestFile(t, filepath.Join(target, "built.txt"), "yes")
	e.unpublish(t, "build")
	if err := e.pods.Delete(csiPodObject("build", "")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(e.kubeletDir, "pods", "uid-build")); err != nil {
		t.Fatal(err)
	}
	e.drainEvents()
	if err := e.ends.sweep(ctx); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if e.volumeOpen(t, "build") || e.generation(t, "maven") != 0 {
		t.Fatal("the volume of a pod gone after unpublish was not discarded")
	}
	e.wantEvent(t, "Normal Discarded", "outcome is unknown")
}

// A pod kept after it completed: the agent ends its volume at once, and
// unmounts the target itself; the kubelet's later unpublish finds it done.
// The next pod sees the commit.
// buildFirst runs pod "first" with a CSI volume of maven that writes
// built.txt and succeeds, and sweeps: its volume ends before the
// kubelet's unpublish. It returns the target.
func (e *csiEnv) buildFirst(t *testing.T) string {
	t.Helper()
	e.setPod(t, csiPodObject("first", corev1.PodRunning))
	target := e.publish(t, "first", map[string]string{kit.AttrCache: "maven"})
	writeTestFile(t, filepath.Join(target, "built.txt"), "from first")
	e.setPod(t, csiPodObject("first", corev1.PodSucceeded))
	if err := e.ends.sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	return target
}

func TestCSIVolumeOfAKeptPodEndsBeforeUnpublish(t *testing.T) {
	e := newCSIEnv(t)
	target := e.buildFirst(t)
	if mounted, _ := mountinfo.Mounted(target); mounted || e.volumeOpen(t, "first") || e.generation(t, "maven") != 1 {
		t.Fatalf("target mounted %v, volume open %v, generation %d; want unmounted, ended, 1", mounted, e.volumeOpen(t, "first"), e.generation(t, "maven"))
	}
	e.unpublish(t, "first")

	e.setPod(t, csiPodObject("second", corev1.PodRunning))
	next := e.publish(t, "second", map[string]string{kit.AttrCache: "maven"})
	if b, err := os.ReadFile(filepath.Join(next, "built.txt")); err != nil || string(b) != "from first" {
		t.Fatalf("the next pod reads %q, %v; want the first pod's commit", b, err)
	}
}

// A kubelet restarted while the build ended publishes the pod's volume
// again after the agent ended it: no second, empty volume is made (it
// would be a second commit of the same build).
func TestCSIPublishOfAnEndedPodIsRefused(t *testing.T) {
	ctx := context.Background()
	e := newCSIEnv(t)
	e.buildFirst(t)
	e.unpublish(t, "first")

	_, err := e.driver.NodePublishVolume(ctx, e.publishRequest("first", map[string]string{kit.AttrCache: "maven"}))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("publish for an ended pod: %v, want FailedPrecondition", err)
	}
	if e.volumeOpen(t, "first") || e.generation(t, "maven") != 1 {
		t.Errorf("volume open %v, generation %d; want no new volume, generation 1", e.volumeOpen(t, "first"), e.generation(t, "maven"))
	}
}

// A pod force-deleted while it may still run on the node: its volume waits
// for the kubelet to stop it and unpublish.
func TestCSIVolumeOfAForceDeletedPodWaitsForUnpublish(t *testing.T) {
	ctx := context.Background()
	e := newCSIEnv(t)
	e.setPod(t, csiPodObject("build", corev1.PodRunning))
	target := e.publish(t, "build", map[string]string{kit.AttrCache: "maven", kit.AttrCommit: "always"})
	writeTestFile(t, filepath.Join(target, "built.txt"), "yes")
	if err := e.pods.Delete(csiPodObject("build", "")); err != nil {
		t.Fatal(err)
	}
	if err := e.ends.sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if !e.volumeOpen(t, "build") {
		t.Fatal("the volume of a pod that may still run was ended")
	}
	e.unpublish(t, "build")
	if e.volumeOpen(t, "build") || e.generation(t, "maven") != 1 {
		t.Fatal("unpublish did not end the volume (commit: always)")
	}
}

// The agent restarts: a new driver over the same store ends, at its first
// sweep, the volume of a pod that ended meanwhile.
func TestCSIVolumeEndsAfterAnAgentRestart(t *testing.T) {
	ctx := context.Background()
	e := newCSIEnv(t)
	e.setPod(t, csiPodObject("build", corev1.PodRunning))
	target := e.publish(t, "build", map[string]string{kit.AttrCache: "maven"})
	writeTestFile(t, filepath.Join(target, "built.txt"), "yes")

	locks := newVolumeLocks()
	ends := newCSIEnds(e.prov, locks, e.pods)
	restarted := newCSIDriver(e.prov, ends, locks, e.kubeletDir, testCSILimits)
	// The kubelet publishes again after its own restart: nothing stacks.
	if _, err := restarted.NodePublishVolume(ctx, e.publishRequest("build", map[string]string{kit.AttrCache: "maven"})); err != nil {
		t.Fatal(err)
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil || len(mounts) != 1 {
		t.Fatalf("mounts at the target after a second publish: %d, %v; want 1", len(mounts), err)
	}
	e.setPod(t, csiPodObject("build", corev1.PodSucceeded))
	if err := ends.sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if e.volumeOpen(t, "build") || e.generation(t, "maven") != 1 {
		t.Fatal("the restarted agent's sweep did not commit the ended pod's volume")
	}
}

func TestCSIPublishRefused(t *testing.T) {
	tests := []struct {
		name       string
		attrs      map[string]string
		objs       []client.Object
		wantCode   codes.Code
		wantReason string
		want       []string
	}{
		{name: "unknown attribute", attrs: map[string]string{kit.AttrCache: "maven", "cahce": "x"}, wantCode: codes.InvalidArgument,
			wantReason: kit.ReasonInvalidAttribute, want: []string{`unknown volumeAttributes ["cahce"]`, "cache (required), mode, commit, size, fallback and storageClass"}},
		{name: "no cache", attrs: map[string]string{}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{"volumeAttributes has no cache", "cache: maven"}},
		{name: "bad mode", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrMode: "rw"}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{`volumeAttributes mode has value "rw"`, "remove the attribute"}},
		{name: "bad commit", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrCommit: "sometimes"}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{`volumeAttributes commit has value "sometimes"`}},
		{name: "bad size", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrSize: "lots"}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{`size has value "lots"`, "10Gi"}},
		// Issue 33, finding 3: a CSI volume is always limited.
		{name: "size past the node's cap", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrSize: "1Ti"}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{`size has value "1Ti"`, "--csi-max-size of 100Gi"}},
		{name: "no size at all", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrSize: "0"}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{`size has value "0"`, "the node's default, 10Gi"}},
		{name: "bad cache name", attrs: map[string]string{kit.AttrCache: "Maven_3"}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{"volumeAttributes cache", "Maven_3"}},
		{name: "write to another namespace", attrs: map[string]string{kit.AttrCache: "team/maven", kit.AttrMode: "write"}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{"volumeAttributes mode", "a pod may only read another namespace's cache", "mode: read"}},
		{name: "read without a grant", attrs: map[string]string{kit.AttrCache: "team/maven"}, objs: []client.Object{cacheObject("team", "maven")},
			wantCode: codes.FailedPrecondition, wantReason: kit.ReasonCacheAccessDenied, want: []string{`does not grant namespace "ci"`, "spec.readers"}},
		{name: "a fallback without a grant", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrFallback: "team/main"}, objs: []client.Object{cacheObject("team", "main")},
			wantCode: codes.FailedPrecondition, wantReason: kit.ReasonCacheAccessDenied, want: []string{`volumeAttributes fallback names fallback team/main: Cache team/main does not grant namespace "ci"`}},
		{name: "bad fallback list", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrFallback: "main,,dev"}, wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute,
			want: []string{`volumeAttributes fallback has value "main,,dev"`, "a cache of the pod's namespace", "fallback: main"}},
		{name: "a cache that syncs through a registry", attrs: map[string]string{kit.AttrCache: "maven"}, objs: []client.Object{publishedCache("ci", "maven")},
			wantCode: codes.FailedPrecondition, wantReason: kit.ReasonRegistryCache, want: []string{"syncs across nodes through registry", "without volumeAttributes storageClass is node-local", "in volumeAttributes storageClass"}},
		{name: "a missing class", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrStorageClass: "shared"}, wantCode: codes.InvalidArgument,
			wantReason: kit.ReasonInvalidAttribute, want: []string{`volumeAttributes storageClass names StorageClass "shared", which does not exist`, "of provisioner layercache.dev/node"}},
		{name: "another provisioner's class", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrStorageClass: "ebs"}, objs: []client.Object{classNamed("ebs", "ebs.csi.aws.com", nil)},
			wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidAttribute, want: []string{`StorageClass "ebs" of provisioner "ebs.csi.aws.com", not of layercache.dev/node`}},
		{name: "a class claims would refuse", attrs: map[string]string{kit.AttrCache: "maven", kit.AttrStorageClass: "shared"},
			objs:     []client.Object{classNamed("shared", v1alpha1.ProvisionerName, map[string]string{kit.ParamSyncTimeout: "soon"})},
			wantCode: codes.InvalidArgument, wantReason: kit.ReasonInvalidStorageClass, want: []string{`StorageClass "shared"`, "syncTimeout"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCSIEnv(t, tt.objs...)
			_, err := e.driver.NodePublishVolume(context.Background(), e.publishRequest("build", tt.attrs))
			if status.Code(err) != tt.wantCode {
				t.Fatalf("publish = %v, want code %s", err, tt.wantCode)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			e.wantEvent(t, "Warning "+tt.wantReason, tt.want...)
			if e.volumeOpen(t, "build") {
				t.Error("a refused volume is in the store")
			}
		})
	}
}

func TestCSIRequestsRefusedBeforeTheStore(t *testing.T) {
	e := newCSIEnv(t)
	ok := e.publishRequest("build", map[string]string{kit.AttrCache: "maven"})
	tests := []struct {
		name string
		edit func(r *csi.NodePublishVolumeRequest)
		want string
	}{
		{"target outside the kubelet's pods", func(r *csi.NodePublishVolumeRequest) { r.TargetPath = "/etc/cron.d" }, "is not a clean path below"},
		{"target with ..", func(r *csi.NodePublishVolumeRequest) { r.TargetPath = e.kubeletDir + "/pods/../../etc" }, "is not a clean path below"},
		{"no volume id", func(r *csi.NodePublishVolumeRequest) { r.VolumeId = "" }, "volume id is empty"},
		{"a persistent volume", func(r *csi.NodePublishVolumeRequest) { delete(r.VolumeContext, kit.AttrEphemeral) }, "not a CSI inline (ephemeral) volume"},
		{"no pod information", func(r *csi.NodePublishVolumeRequest) { delete(r.VolumeContext, kit.AttrPodNamespace) }, "podInfoOnMount: true"},
		// Issue 33, finding 9: the pod information must be the target's pod.
		{"another pod's UID", func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[kit.AttrPodUID] = "uid-other" }, `directory of pod UID "uid-build"`},
		{"a block volume", func(r *csi.NodePublishVolumeRequest) {
			r.VolumeCapability = &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
		}, "not block devices"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &csi.NodePublishVolumeRequest{VolumeId: ok.VolumeId, TargetPath: ok.TargetPath, VolumeCapability: ok.VolumeCapability, VolumeContext: map[string]string{}}
			for k, v := range ok.VolumeContext {
				r.VolumeContext[k] = v
			}
			tt.edit(r)
			_, err := e.driver.NodePublishVolume(context.Background(), r)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("publish = %v, want InvalidArgument saying %q", err, tt.want)
			}
		})
	}
}

// classNamed is StorageClass name of provisioner, with params.
func classNamed(name, provisioner string, params map[string]string) *storagev1.StorageClass {
	class := kittest.Class(params)
	class.Name, class.Provisioner = name, provisioner
	return class
}

func publishedCache(ns, name string) *v1alpha1.Cache {
	c := cacheObject(ns, name)
	c.Status.Published = &v1alpha1.PublishedChain{Repository: "registry.example/caches/" + ns + "-" + name}
	return c
}

// The kubelet's view: it finds the registration socket, asks it for the
// driver's endpoint, and calls the driver there; a second agent replaces
// the sockets a killed one left behind.
func TestCSIServesAndRegisters(t *testing.T) {
	e := newCSIEnv(t)
	dir, err := os.MkdirTemp("", "csi") // short: socket paths have a 108-byte bound
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sockets := csiSocketsIn(dir)
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- serveCSI(ctx, e.driver, sockets) }()
		info := dialRegistration(t, sockets.Registration)
		if info.Type != "CSIPlugin" || info.Name != v1alpha1.CSIDriverName || info.Endpoint != sockets.Endpoint {
			t.Fatalf("registration = %+v, want a CSIPlugin %s at %s", info, v1alpha1.CSIDriverName, sockets.Endpoint)
		}
		conn, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		nodeInfo, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		conn.Close()
		if err != nil || nodeInfo.NodeId != "node-a" {
			t.Fatalf("NodeGetInfo = %v, %v; want node-a", nodeInfo, err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("serveCSI: %v", err)
		}
		// What a killed agent leaves behind.
		for _, p := range []string{sockets.Endpoint, sockets.Registration} {
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func dialRegistration(t *testing.T, path string) *registerapi.PluginInfo {
	t.Helper()
	var err error
	for range 100 { // until the server listens; a fresh client each time, which does not back off
		var conn *grpc.ClientConn
		if conn, err = grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			t.Fatal(err)
		}
		var info *registerapi.PluginInfo
		info, err = registerapi.NewRegistrationClient(conn).GetInfo(context.Background(), &registerapi.InfoRequest{})
		conn.Close()
		if err == nil {
			return info
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("registration GetInfo at %s: %v", path, err)
	return nil
}

// A pod deleted after its volume ended leaves an outcome behind; the sweep
// forgets it, and keeps those of pods whose volumes are still open.
func TestCSISweepForgetsOutcomesOfEndedVolumes(t *testing.T) {
	e := newCSIEnv(t)
	e.setPod(t, csiPodObject("open", corev1.PodRunning))
	e.publish(t, "open", map[string]string{kit.AttrCache: "maven"})
	e.ends.seen.set("uid-open", v1alpha1.OutcomeSucceeded)
	e.ends.seen.set("uid-ended-long-ago", v1alpha1.OutcomeSucceeded)
	if err := e.ends.sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e.ends.seen.get("uid-ended-long-ago") != "" || e.ends.seen.get("uid-open") != v1alpha1.OutcomeSucceeded {
		t.Errorf("after the sweep: %v", e.ends.seen.m)
	}
}

// A target a process still holds when the kubelet unpublishes is never
// detached lazily (issue 33, finding 8): that process's later writes
// would land in the layer the commit sealed. The unpublish fails, the
// volume stays open, and the kubelet's retry after the holder let go
// commits what the build wrote.
func TestCSIBusyTargetIsNeverDetachedLazily(t *testing.T) {
	e := newCSIEnv(t)
	e.setPod(t, csiPodObject("build", corev1.PodRunning))
	target := e.publish(t, "build", map[string]string{kit.AttrCache: "maven"})
	writeTestFile(t, filepath.Join(target, "built.txt"), "yes")
	holder, err := os.Create(filepath.Join(target, "late.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	e.setPod(t, csiPodObject("build", corev1.PodSucceeded))

	_, err = e.driver.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-build", TargetPath: target})
	if err == nil || !strings.Contains(err.Error(), "still holds it") {
		t.Fatalf("unpublish of a target a process holds: %v, want an error saying it is held", err)
	}
	if mounted, err := mountinfo.Mounted(target); err != nil || !mounted {
		t.Fatalf("a held target after the refused unpublish: mounted = %v, %v; want it still mounted, not detached", mounted, err)
	}
	if !e.volumeOpen(t, "build") || e.generation(t, "maven") != 0 {
		t.Fatal("the volume ended while a process held its target")
	}
	if _, err := holder.WriteString("written after the unpublish"); err != nil {
		t.Fatal(err)
	}
	must(t, holder.Close())
	e.unpublish(t, "build")
	if e.volumeOpen(t, "build") || e.generation(t, "maven") != 1 {
		t.Fatal("the retried unpublish did not commit the volume")
	}
}

// Any pod may name the driver; only namespaces a cluster admin opted in
// get a volume (issue 33, finding 3). The refusal is an Event on the pod
// that names the label.
func TestCSIVolumesAreOptInPerNamespace(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ci"}}
	e := newCSIEnv(t)
	must(t, e.client.Update(context.Background(), ns)) // the label removed
	_, err := e.driver.NodePublishVolume(context.Background(), e.publishRequest("build", map[string]string{kit.AttrCache: "maven"}))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "has not opted in") {
		t.Fatalf("publish in a namespace without %s: %v, want FailedPrecondition saying it has not opted in", v1alpha1.LabelCSI, err)
	}
	e.wantEvent(t, "Warning "+kit.ReasonCSINotEnabled, "kubectl label namespace ci "+v1alpha1.LabelCSI+"="+v1alpha1.CSIEnabled)
	if e.volumeOpen(t, "build") {
		t.Error("a volume of a namespace that has not opted in is in the store")
	}
}

// A CSI volume without a size attribute gets the node's default limit.
func TestCSIVolumeWithoutSizeIsLimited(t *testing.T) {
	e := newCSIEnv(t)
	e.publish(t, "build", map[string]string{kit.AttrCache: "maven"})
	vol, err := e.store.Volume(context.Background(), csiStoreID("csi-build"))
	must(t, err)
	if vol.LimitBytes != testCSILimits.Default {
		t.Errorf("limit of a CSI volume without a size attribute = %d, want the default %d", vol.LimitBytes, testCSILimits.Default)
	}
}

// A CSI volume that names a class gets what a claim of it gets: its
// owner and mode, its forced read, and a Cache labelled with the class.
func TestCSIVolumeTakesItsClass(t *testing.T) {
	tests := []struct {
		name      string
		params    map[string]string
		check     func(t *testing.T, root os.FileInfo, vol *layerfs.Volume)
		wantEvent string
	}{
		{name: "owner and mode", params: map[string]string{"uid": "1000", "gid": "2000", "mode": "0770"},
			check: func(t *testing.T, root os.FileInfo, vol *layerfs.Volume) {
				st := root.Sys().(*syscall.Stat_t)
				if st.Uid != 1000 || st.Gid != 2000 || root.Mode().Perm() != 0o770 {
					t.Errorf("volume root %d:%d %v, want 1000:2000 0770 from the class", st.Uid, st.Gid, root.Mode().Perm())
				}
			}},
		{name: "a read class makes a read view", params: map[string]string{"mode": "read"}, wantEvent: "Normal " + kit.ReasonModeForcedRead,
			check: func(t *testing.T, _ os.FileInfo, vol *layerfs.Volume) {
				if !vol.ReadOnly {
					t.Error("the volume of a read class is writable")
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCSIEnv(t, classNamed("build-cache", v1alpha1.ProvisionerName, tt.params))
			e.setPod(t, csiPodObject("build", corev1.PodRunning))
			target := e.publish(t, "build", map[string]string{kit.AttrCache: "maven", kit.AttrStorageClass: "build-cache", kit.AttrMode: "write"})
			vol, err := e.store.Volume(context.Background(), csiStoreID("csi-build"))
			must(t, err)
			if got := vol.Labels[labelStorageClass]; got != "build-cache" {
				t.Errorf("volume label %s = %q, want the class build-cache", labelStorageClass, got)
			}
			root, err := os.Stat(target)
			must(t, err)
			tt.check(t, root, vol)
			var cache v1alpha1.Cache
			must(t, e.client.Get(context.Background(), client.ObjectKey{Namespace: "ci", Name: "maven"}, &cache))
			if got := cache.Labels[v1alpha1.LabelStorageClass]; got != "build-cache" {
				t.Errorf("Cache label %s = %q, want build-cache", v1alpha1.LabelStorageClass, got)
			}
			if tt.wantEvent != "" {
				e.wantEvent(t, tt.wantEvent, `StorageClass "build-cache"`, "volumeAttributes mode is write")
			}
		})
	}
}

// A class's fallback template sees a CSI volume's pod as it sees a
// claim's: a branch's first build starts from the cache its pod's label
// names.
func TestCSIVolumeFallsBackByItsClassTemplate(t *testing.T) {
	e := newCSIEnv(t, classNamed("branches", v1alpha1.ProvisionerName, map[string]string{kit.ParamFallback: "{{ .Namespace }}/{{ .Pod.Labels.base }}"}))
	e.setPod(t, csiPodObject("main-build", corev1.PodRunning))
	writeTestFile(t, filepath.Join(e.publish(t, "main-build", map[string]string{kit.AttrCache: "main"}), "lib.jar"), "from main")
	e.setPod(t, csiPodObject("main-build", corev1.PodSucceeded))
	e.unpublish(t, "main-build")
	e.drainEvents()

	pod := csiPodObject("feature-build", corev1.PodRunning)
	pod.Labels = map[string]string{"base": "main"}
	e.setPod(t, pod)
	target := e.publish(t, "feature-build", map[string]string{kit.AttrCache: "feature", kit.AttrStorageClass: "branches"})
	if got, err := os.ReadFile(filepath.Join(target, "lib.jar")); err != nil || string(got) != "from main" {
		t.Errorf("lib.jar in the branch's first volume = %q, %v; want main's", got, err)
	}
	e.wantEvent(t, "Normal "+kit.ReasonSeeded, "starts from fallback ci/main")
}
