package volumes

import (
	"context"
	"errors"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

func TestShouldProvision(t *testing.T) {
	p := &Provisioner{node: "node-a"}
	tests := []struct {
		name string
		ann  map[string]string
		want bool
	}{
		{"this node", map[string]string{kit.AnnSelectedNode: "node-a"}, true},
		{"other node", map[string]string{kit.AnnSelectedNode: "node-b"}, false},
		{"prefix of this node", map[string]string{kit.AnnSelectedNode: "node-a2"}, false},
		// Claims without a selected node reach Provision only when their
		// class binds immediately, which Provision explains and refuses.
		{"no selected node", nil, true},
		{"empty selected node", map[string]string{kit.AnnSelectedNode: ""}, true},
	}
	for _, tt := range tests {
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: tt.ann}}
		if got := p.ShouldProvision(context.Background(), claim); got != tt.want {
			t.Errorf("%s: ShouldProvision = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestShouldDelete(t *testing.T) {
	env := newTestEnv(t, nil)
	tests := []struct {
		name string
		node string
		want bool
	}{
		{"this node", "node-a", true},
		{"other node", "node-b", false},
		{"no identity", "", false},
	}
	for _, tt := range tests {
		pv := testPV(map[string]string{v1alpha1.AnnotationNode: tt.node})
		if tt.node == "" {
			pv.Annotations = nil
		}
		if got := env.prov.ShouldDelete(context.Background(), pv); got != tt.want {
			t.Errorf("%s: ShouldDelete = %v, want %v", tt.name, got, tt.want)
		}
		if tt.want {
			continue
		}
		// Delete must never touch another node's volume, even if called.
		err := env.prov.Delete(context.Background(), pv)
		var ignored *controller.IgnoredError
		if !errors.As(err, &ignored) {
			t.Errorf("%s: Delete error %v, want IgnoredError", tt.name, err)
		}
	}
	if len(env.store.Commits)+len(env.store.Discards) != 0 {
		t.Errorf("Delete of foreign PVs touched the store: commits %v discards %v", env.store.Commits, env.store.Discards)
	}
}

// provisionOptions is a claim of namespace ns placed on node-a.
func provisionOptions(ns string, ann map[string]string, params map[string]string) controller.ProvisionOptions {
	claim := kittest.Claim(ns, ann)
	claim.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	return controller.ProvisionOptions{
		StorageClass: kittest.Class(params), PVName: "pvc-" + string(claim.UID), PVC: claim, SelectedNodeName: "node-a",
	}
}

func cacheObject(ns, name string, readers ...string) *v1alpha1.Cache {
	return &v1alpha1.Cache{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.CacheSpec{Readers: readers},
	}
}

func deletingCache(ns, name string) *v1alpha1.Cache {
	c := cacheObject(ns, name)
	now := metav1.Now()
	c.DeletionTimestamp = &now
	c.Finalizers = []string{v1alpha1.FinalizerCleanup}
	return c
}

func TestProvisionRefused(t *testing.T) {
	immediate := storagev1.VolumeBindingImmediate
	tests := []struct {
		name      string
		ns        string
		ann       map[string]string
		params    map[string]string
		objs      []client.Object
		change    func(*controller.ProvisionOptions)
		wantEvent string
		contains  []string
	}{
		{name: "missing cache annotation", ns: "ci",
			wantEvent: "Warning InvalidAnnotation", contains: []string{"layercache.dev/cache is missing", "for example"}},
		{name: "bad cache name", ns: "ci", ann: map[string]string{v1alpha1.AnnotationCache: "My_Cache"},
			wantEvent: "Warning InvalidAnnotation", contains: []string{"layercache.dev/cache", `"My_Cache"`, "DNS-1123"}},
		{name: "bad mode", ns: "ci", ann: map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationMode: "readonly"},
			wantEvent: "Warning InvalidAnnotation", contains: []string{"layercache.dev/mode", `"readonly"`, `use "write" or "read"`}},
		{name: "bad commit", ns: "ci", ann: map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: "on-failure"},
			wantEvent: "Warning InvalidAnnotation", contains: []string{"layercache.dev/commit", `"on-failure"`}},
		{name: "write to another namespace", ns: "pr", objs: []client.Object{cacheObject("ci", "maven", "pr")},
			ann:       map[string]string{v1alpha1.AnnotationCache: "ci/maven", v1alpha1.AnnotationMode: "write"},
			wantEvent: "Warning InvalidAnnotation", contains: []string{"may only read another namespace's cache"}},
		{name: "read without grant", ns: "pr", objs: []client.Object{cacheObject("ci", "maven", "other")},
			ann:       map[string]string{v1alpha1.AnnotationCache: "ci/maven"},
			wantEvent: "Warning CacheAccessDenied", contains: []string{`does not grant namespace "pr"`, "spec.readers"}},
		{name: "read of a cache that has no Cache", ns: "pr",
			ann:       map[string]string{v1alpha1.AnnotationCache: "ci/maven"},
			wantEvent: "Warning CacheAccessDenied", contains: []string{"does not exist", `namespace "ci" must create Cache "maven"`}},
		{name: "own cache being deleted", ns: "ci", objs: []client.Object{deletingCache("ci", "maven")},
			ann:       map[string]string{v1alpha1.AnnotationCache: "maven"},
			wantEvent: "Warning CacheDeleting", contains: []string{"being deleted"}},
		{name: "granted cache being deleted", ns: "pr", objs: []client.Object{func() client.Object {
			c := deletingCache("ci", "maven")
			c.Spec.Readers = []string{"pr"}
			return c
		}()},
			ann:       map[string]string{v1alpha1.AnnotationCache: "ci/maven"},
			wantEvent: "Warning CacheDeleting"},
		{name: "immediate binding", ns: "ci", ann: map[string]string{v1alpha1.AnnotationCache: "maven"},
			change: func(o *controller.ProvisionOptions) {
				o.StorageClass.VolumeBindingMode = &immediate
				o.SelectedNodeName = ""
			},
			wantEvent: "Warning InvalidStorageClass", contains: []string{"volumeBindingMode is Immediate", "WaitForFirstConsumer"}},
		{name: "bad class parameter", ns: "ci", ann: map[string]string{v1alpha1.AnnotationCache: "maven"},
			params:    map[string]string{"uid": "nobody"},
			wantEvent: "Warning InvalidStorageClass", contains: []string{"parameter uid", `"nobody"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, nil, tt.objs...)
			opts := provisionOptions(tt.ns, tt.ann, tt.params)
			if tt.change != nil {
				tt.change(&opts)
			}
			pv, state, err := env.prov.Provision(context.Background(), opts)
			if err == nil || pv != nil {
				t.Fatalf("Provision = %v, %v; want a refusal", pv, err)
			}
			if state != controller.ProvisioningFinished {
				t.Errorf("state %q, want Finished: nothing runs in the background", state)
			}
			env.wantEvent(t, tt.wantEvent, tt.contains...)
			if env.store.Mounts != 0 {
				t.Errorf("a refused claim was mounted")
			}
			if tt.ns != "ci" {
				var list v1alpha1.CacheList
				if err := env.client.List(context.Background(), &list, client.InNamespace(tt.ns)); err != nil {
					t.Fatal(err)
				}
				if len(list.Items) != 0 {
					t.Errorf("a refused claim created Caches %v", list.Items)
				}
			}
		})
	}
}

func TestProvisionOtherNode(t *testing.T) {
	env := newTestEnv(t, nil)
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	opts.SelectedNodeName = "node-b"
	_, _, err := env.prov.Provision(context.Background(), opts)
	var ignored *controller.IgnoredError
	if !errors.As(err, &ignored) {
		t.Fatalf("Provision for another node: error %v, want IgnoredError", err)
	}
	if env.store.Mounts != 0 {
		t.Error("mounted a volume for another node")
	}
}

func TestProvisionOwnCache(t *testing.T) {
	env := newTestEnv(t, nil)
	ctx := context.Background()
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: "always"},
		map[string]string{"uid": "1000", "gid": "1001", "mode": "0750"})
	opts.PVC.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "build-1", Controller: new(true)}}

	pv, state, err := env.prov.Provision(ctx, opts)
	if err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision: %v, %v", state, err)
	}
	maven := layerfs.CacheRef{Namespace: "ci", Name: "maven"}
	// The claim requests 1Gi: the most its build may add to the cache.
	wantMount := layerfs.MountOptions{Cache: maven, UID: 1000, GID: 1001, Mode: 0o750, Writer: "ci/build-1", LimitBytes: 1 << 30}
	if got := env.store.MountOpts[opts.PVName]; !reflect.DeepEqual(got, wantMount) {
		t.Errorf("mounted with %+v, want %+v", got, wantMount)
	}
	if pv.Name != opts.PVName || pv.Spec.HostPath.Path != "/fake/volumes/"+opts.PVName+"/merged" {
		t.Errorf("PV %s path %s, want the volume's merged path", pv.Name, pv.Spec.HostPath.Path)
	}
	for k, want := range map[string]string{
		v1alpha1.AnnotationCache: "ci/maven", v1alpha1.AnnotationMode: "write", v1alpha1.AnnotationCommit: "always",
		v1alpha1.AnnotationBaseGeneration: "0", v1alpha1.AnnotationNode: "node-a",
	} {
		if got := pv.Annotations[k]; got != want {
			t.Errorf("PV annotation %s = %q, want %q", k, got, want)
		}
	}
	// First use creates the Cache in the claim's namespace.
	var cache v1alpha1.Cache
	if err := env.client.Get(ctx, client.ObjectKey{Namespace: "ci", Name: "maven"}, &cache); err != nil {
		t.Fatalf("Cache ci/maven not created on first use: %v", err)
	}
	// Labelled with the class, whose clusterMaxAge the manager reads.
	if got := cache.Labels[v1alpha1.LabelStorageClass]; got != opts.StorageClass.Name {
		t.Errorf("Cache label %s = %q, want the claim's class %q", v1alpha1.LabelStorageClass, got, opts.StorageClass.Name)
	}
	if got := metricValue(t, env.prov.metrics.Misses.WithLabelValues("ci", "maven")); got != 1 {
		t.Errorf("misses = %v, want 1 (nothing committed yet)", got)
	}
	if n := env.prov.reports.Queue.Len(); n != 1 {
		t.Errorf("report queue has %d items, want the provisioned cache", n)
	}

	// Provisioning the same claim again returns the same volume.
	again, _, err := env.prov.Provision(ctx, opts)
	if err != nil {
		t.Fatalf("second Provision: %v", err)
	}
	if again.Spec.HostPath.Path != pv.Spec.HostPath.Path || len(env.store.VolumeByID) != 1 {
		t.Errorf("second Provision made another volume: %s vs %s, %d volumes", again.Spec.HostPath.Path, pv.Spec.HostPath.Path, len(env.store.VolumeByID))
	}
}

func TestProvisionHit(t *testing.T) {
	env := newTestEnv(t, nil, cacheObject("ci", "maven"))
	maven := layerfs.CacheRef{Namespace: "ci", Name: "maven"}
	env.store.Cache(maven).Generation = 4
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	pv, _, err := env.prov.Provision(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := pv.Annotations[v1alpha1.AnnotationBaseGeneration]; got != "4" {
		t.Errorf("base generation %q, want 4", got)
	}
	if got := metricValue(t, env.prov.metrics.Hits.WithLabelValues("ci", "maven", kit.HitCache)); got != 1 {
		t.Errorf("hits from the cache = %v, want 1", got)
	}
}

func TestProvisionGrantedRead(t *testing.T) {
	env := newTestEnv(t, nil, cacheObject("ci", "maven", "pr"))
	opts := provisionOptions("pr", map[string]string{v1alpha1.AnnotationCache: "ci/maven"}, nil)
	pv, _, err := env.prov.Provision(context.Background(), opts)
	if err != nil {
		t.Fatalf("granted read refused: %v", err)
	}
	if !env.store.MountOpts[opts.PVName].ReadOnly || pv.Annotations[v1alpha1.AnnotationMode] != "read" {
		t.Errorf("another namespace's cache must be mounted read-only: mount %+v, mode %q", env.store.MountOpts[opts.PVName], pv.Annotations[v1alpha1.AnnotationMode])
	}
}

func TestProvisionForcedRead(t *testing.T) {
	env := newTestEnv(t, nil)
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationMode: "write"},
		map[string]string{"mode": "read"})
	pv, _, err := env.prov.Provision(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if pv.Annotations[v1alpha1.AnnotationMode] != "read" || !env.store.MountOpts[opts.PVName].ReadOnly {
		t.Errorf("class mode read must force a read view")
	}
	env.wantEvent(t, "Normal ModeForcedRead", "never committed")
}

func TestProvisionCacheLookupFails(t *testing.T) {
	// A Cache read that fails for a reason other than absence must not
	// be taken as "no Cache": the claim is retried, nothing is mounted.
	env := newTestEnv(t, nil)
	env.prov.caches.Client = failingGetClient{env.client}
	opts := provisionOptions("ci", map[string]string{v1alpha1.AnnotationCache: "maven"}, nil)
	_, state, err := env.prov.Provision(context.Background(), opts)
	if err == nil || state != controller.ProvisioningFinished || env.store.Mounts != 0 {
		t.Fatalf("Provision = %v, %v with %d mounts; want a retried error and no mount", state, err, env.store.Mounts)
	}
}

type failingGetClient struct{ client.Client }

func (failingGetClient) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return apierrors.NewServiceUnavailable("etcd is down")
}
