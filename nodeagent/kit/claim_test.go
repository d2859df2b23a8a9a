package kit

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

func TestParseClass(t *testing.T) {
	immediate := storagev1.VolumeBindingImmediate
	tests := []struct {
		name    string
		class   func(*storagev1.StorageClass)
		params  map[string]string
		want    ClassParams
		wantErr string // substring; "" means success
	}{
		{name: "defaults", want: ClassParams{}},
		{name: "uid gid mode", params: map[string]string{"uid": "1000", "gid": "2000", "mode": "0775"},
			want: ClassParams{UID: 1000, GID: 2000, Perm: 0o775}},
		{name: "mode without leading zero", params: map[string]string{"mode": "755"}, want: ClassParams{Perm: 0o755}},
		{name: "forced read", params: map[string]string{"mode": "read"}, want: ClassParams{ForceRead: true}},
		{name: "setuid programs and devices allowed", params: map[string]string{"allowSetuid": "true", "allowDevices": "true"},
			want: ClassParams{AllowSetuid: true, AllowDevices: true}},
		{name: "allowSetuid not a bool", params: map[string]string{"allowSetuid": "yes"}, wantErr: `parameter allowSetuid has value "yes": use "true" or "false"`},
		{name: "immediate binding", class: func(c *storagev1.StorageClass) { c.VolumeBindingMode = &immediate },
			wantErr: "volumeBindingMode is Immediate"},
		{name: "binding unset means immediate", class: func(c *storagev1.StorageClass) { c.VolumeBindingMode = nil },
			wantErr: "WaitForFirstConsumer"},
		{name: "mount options", class: func(c *storagev1.StorageClass) { c.MountOptions = []string{"noatime"} },
			wantErr: "remove mountOptions"},
		{name: "unknown parameter", params: map[string]string{"uid": "1", "owner": "me"}, wantErr: `unknown parameters ["owner"]`},
		{name: "cluster max age", params: map[string]string{"clusterMaxAge": "168h"}, want: ClassParams{}},
		{name: "cluster max age zero keeps forever", params: map[string]string{"clusterMaxAge": "0s"}, want: ClassParams{}},
		{name: "negative cluster max age", params: map[string]string{"clusterMaxAge": "-1h"},
			wantErr: `StorageClass "layercache": parameter clusterMaxAge has value "-1h": use a duration of at least 0 such as "720h" (30 days), or "0s" to keep caches forever`},
		{name: "cluster max age in days", params: map[string]string{"clusterMaxAge": "30d"}, wantErr: `parameter clusterMaxAge has value "30d"`},
		{name: "uid not a number", params: map[string]string{"uid": "root"}, wantErr: `parameter uid has value "root"`},
		{name: "negative gid", params: map[string]string{"gid": "-1"}, wantErr: `parameter gid has value "-1"`},
		{name: "mode not octal", params: map[string]string{"mode": "0789"}, wantErr: `parameter mode has value "0789"`},
		{name: "mode write is not a class mode", params: map[string]string{"mode": "write"}, wantErr: `or "read"`},
		{name: "mode too big", params: map[string]string{"mode": "17777"}, wantErr: `parameter mode has value "17777"`},
		{name: "mode zero", params: map[string]string{"mode": "0000"}, wantErr: "lets nobody use the volume"},
		{name: "setuid", params: map[string]string{"mode": "4755"}, wantErr: "setuid"},
		{name: "snapshot layout", params: map[string]string{"layout": "snapshot"}, want: ClassParams{Layout: layerfs.LayoutSnapshot}},
		{name: "overlay layout", params: map[string]string{"layout": "overlay"}, want: ClassParams{Layout: layerfs.LayoutOverlay}},
		{name: "unknown layout", params: map[string]string{"layout": "zfs"}, wantErr: `parameter layout has value "zfs": use "overlay" (the default) or "snapshot"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			class := kittest.Class(tt.params)
			if tt.class != nil {
				tt.class(class)
			}
			got, err := ParseClass(class)
			checkClaimError(t, err, tt.wantErr, ReasonInvalidStorageClass)
			tt.want.Name = class.Name
			if tt.wantErr == "" && got != tt.want {
				t.Errorf("parseClass = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A snapshot class syncs through a registry: its layout reaches the
// sync, which makes a cache the node lacks of that layout.
func TestSnapshotClassWithRegistry(t *testing.T) {
	class, err := ParseClass(kittest.Class(map[string]string{"layout": "snapshot", "registry": "registry.example/caches"}))
	must(t, err)
	if class.Registry == nil || class.Registry.Layout != layerfs.LayoutSnapshot {
		t.Fatalf("registry params = %+v, want the snapshot layout", class.Registry)
	}
	if got := class.Registry.ForCache(layerfs.CacheRef{Namespace: "ci", Name: "c"}, 0).Layout; got != layerfs.LayoutSnapshot {
		t.Errorf("ForCache layout = %q, want snapshot", got)
	}
}

func TestParseClaim(t *testing.T) {
	ref := func(ns, name string) layerfs.CacheRef { return layerfs.CacheRef{Namespace: ns, Name: name} }
	tests := []struct {
		name    string
		ann     map[string]string
		class   ClassParams
		want    VolumeRequest
		wantErr string
	}{
		{name: "own cache, defaults",
			ann:  map[string]string{v1alpha1.AnnotationCache: "maven"},
			want: VolumeRequest{Cache: ref("ci", "maven"), Mode: "write", Commit: "on-success"}},
		{name: "own cache by full name",
			ann:  map[string]string{v1alpha1.AnnotationCache: "ci/maven"},
			want: VolumeRequest{Cache: ref("ci", "maven"), Mode: "write", Commit: "on-success"}},
		{name: "own cache read, commit always",
			ann:  map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationMode: "read", v1alpha1.AnnotationCommit: "always"},
			want: VolumeRequest{Cache: ref("ci", "maven"), Mode: "read", Commit: "always"}},
		{name: "other namespace defaults to read",
			ann:  map[string]string{v1alpha1.AnnotationCache: "trusted/maven"},
			want: VolumeRequest{Cache: ref("trusted", "maven"), Mode: "read", Commit: "on-success"}},
		{name: "other namespace explicit read",
			ann:  map[string]string{v1alpha1.AnnotationCache: "trusted/maven", v1alpha1.AnnotationMode: "read", v1alpha1.AnnotationCommit: "never"},
			want: VolumeRequest{Cache: ref("trusted", "maven"), Mode: "read", Commit: "never"}},
		{name: "other namespace write refused",
			ann:     map[string]string{v1alpha1.AnnotationCache: "trusted/maven", v1alpha1.AnnotationMode: "write"},
			wantErr: `may only read another namespace's cache; set layercache.dev/mode: read`},
		{name: "class forces read over explicit write",
			ann:   map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationMode: "write"},
			class: ClassParams{ForceRead: true},
			want:  VolumeRequest{Cache: ref("ci", "maven"), Mode: "read", Commit: "on-success", ForcedRead: true}},
		{name: "class forces read over default",
			ann:   map[string]string{v1alpha1.AnnotationCache: "maven"},
			class: ClassParams{ForceRead: true},
			want:  VolumeRequest{Cache: ref("ci", "maven"), Mode: "read", Commit: "on-success"}},
		{name: "class ownership carried",
			ann:   map[string]string{v1alpha1.AnnotationCache: "maven"},
			class: ClassParams{UID: 1000, GID: 1000, Perm: 0o750},
			want:  VolumeRequest{Cache: ref("ci", "maven"), Mode: "write", Commit: "on-success", UID: 1000, GID: 1000, Perm: 0o750}},
		{name: "cache missing", ann: nil, wantErr: `annotation layercache.dev/cache is missing and StorageClass "" has no cache parameter`},
		{name: "cache empty", ann: map[string]string{v1alpha1.AnnotationCache: ""}, wantErr: `has value "": the cache name "" is not valid (it is empty)`},
		{name: "cache upper case", ann: map[string]string{v1alpha1.AnnotationCache: "Maven"}, wantErr: "upper-case"},
		{name: "cache path traversal", ann: map[string]string{v1alpha1.AnnotationCache: "../etc"}, wantErr: `namespace name ".." is not valid`},
		{name: "cache dot dot name", ann: map[string]string{v1alpha1.AnnotationCache: "a..b"}, wantErr: "path separator or '..'"},
		{name: "cache two slashes", ann: map[string]string{v1alpha1.AnnotationCache: "a/b/c"}, wantErr: "more than one '/'"},
		{name: "cache too long", ann: map[string]string{v1alpha1.AnnotationCache: strings.Repeat("a", 64)}, wantErr: "64 characters"},
		{name: "cache empty namespace", ann: map[string]string{v1alpha1.AnnotationCache: "/maven"}, wantErr: `namespace name "" is not valid`},
		{name: "cache underscore", ann: map[string]string{v1alpha1.AnnotationCache: "my_cache"}, wantErr: "characters other than"},
		{name: "bad mode", ann: map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationMode: "rw"},
			wantErr: `annotation layercache.dev/mode has value "rw": use "write" or "read", or remove the annotation (the default is write in the cache's own namespace and read for another namespace's cache)`},
		{name: "bad commit", ann: map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: "yes"},
			wantErr: `annotation layercache.dev/commit has value "yes": use "on-success", "always", "never" or "on-marker", or remove the annotation (the default is on-success)`},
		{name: "commit on marker",
			ann:  map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: "on-marker"},
			want: VolumeRequest{Cache: ref("ci", "maven"), Mode: "write", Commit: "on-marker"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := kittest.Claim("ci", tt.ann)
			got, err := parseClaim(claim, tt.class, nil)
			checkClaimError(t, err, tt.wantErr, ReasonInvalidAnnotation)
			if tt.wantErr != "" {
				return
			}
			tt.want.Writer = "ci/build-cache"
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseClaim = %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestWriterOf(t *testing.T) {
	claim := kittest.Claim("ci", nil)
	if got := writerOf(claim); got != "ci/build-cache" {
		t.Errorf("standalone claim: writer %q, want ci/build-cache", got)
	}
	claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "build-7x2k", Controller: new(true)}}
	if got := writerOf(claim); got != "ci/build-7x2k" {
		t.Errorf("ephemeral claim: writer %q, want the owning pod ci/build-7x2k", got)
	}
}

func TestMountOptions(t *testing.T) {
	req := VolumeRequest{Cache: layerfs.CacheRef{Namespace: "ci", Name: "maven"}, Mode: "read", UID: 1, GID: 2, Perm: 0o700, Writer: "ci/p"}
	got := req.MountOptions()
	want := layerfs.MountOptions{Cache: req.Cache, ReadOnly: true, UID: 1, GID: 2, Mode: os.FileMode(0o700), Writer: "ci/p"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mountOptions = %+v, want %+v", got, want)
	}
}

// checkClaimError checks that err is nil when want is "", else a
// *ClaimError of the given reason whose message contains want.
func checkClaimError(t *testing.T, err error, want, reason string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	var ce *ClaimError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T), want a claimError containing %q", err, err, want)
	}
	if ce.Reason != reason {
		t.Errorf("reason %q, want %q", ce.Reason, reason)
	}
	if !strings.Contains(ce.Message, want) {
		t.Errorf("message %q does not contain %q", ce.Message, want)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// parseClaim validates a claim's annotations against its class and returns
// what to mount. pod is the pod that owns the claim, if any; it matters only
// when the class's templates name the cache or its fallbacks. It does not
// check access to another namespace's cache.
func parseClaim(claim *corev1.PersistentVolumeClaim, class ClassParams, pod *corev1.Pod) (VolumeRequest, error) {
	return ParseSettings(ClaimSettings(claim, pod), class)
}
