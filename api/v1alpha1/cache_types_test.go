package v1alpha1

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func fullCache() *Cache {
	now := metav1.Now().Rfc3339Copy()
	size := resource.MustParse("20Gi")
	return &Cache{
		TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: "Cache"},
		ObjectMeta: metav1.ObjectMeta{Name: "maven", Namespace: "ci"},
		Spec: CacheSpec{
			Readers:   []string{"pr-builds"},
			Retention: &Retention{MaxAge: &metav1.Duration{Duration: 168 * 3600e9}, MaxSize: &size},
		},
		Status: CacheStatus{
			Generation: 2, Size: "10B", NodeCount: 1, LastUsed: &now, SeededFrom: "ci/main@7",
			Published: &PublishedChain{Repository: "reg.example/caches/ci/maven", Secret: "creds", Generation: 1, Layers: []PublishedLayer{{
				Digest: "sha256:aa", DiffID: "sha256:bb", MediaType: "application/vnd.oci.image.layer.v1.tar+zstd", Size: 3, Generation: 1, Node: "n1", Covers: []string{"sha256:cc"},
				Index: "sha256:dd", IndexSize: 140,
			}}},
		},
	}
}

func fullReplica() *CacheReplica {
	now := metav1.Now().Rfc3339Copy()
	return &CacheReplica{
		TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: "CacheReplica"},
		ObjectMeta: metav1.ObjectMeta{Name: "maven.n1", Namespace: "ci"},
		Spec:       CacheReplicaSpec{Cache: "maven", Node: "n1"},
		Status: CacheReplicaStatus{Generation: 2, Layers: 2, SizeBytes: 10, LastUsed: &now, LastWriter: "ci/ws", Unpublished: 1, Filling: 1,
			SeededFrom: &CacheSeed{Namespace: "ci", Name: "main", Generation: 7}, PublishError: "refused"},
	}
}

// jsonFields lists the paths of obj's spec and status leaves, sorted.
func jsonFields(t *testing.T, obj any) []string {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	var got []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, child := range v {
				walk(prefix+"."+k, child)
			}
		case []any:
			for _, child := range v {
				walk(prefix+"[]", child)
			}
		default:
			got = append(got, prefix)
		}
	}
	walk("spec", m["spec"])
	walk("status", m["status"])
	slices.Sort(got)
	return got
}

// The JSON field names are the contract with the node agents (server-side
// apply of their replicas), kubectl printer columns and users' manifests.
func TestJSONFields(t *testing.T) {
	tests := []struct {
		name string
		obj  any
		want []string
	}{{name: "Cache", obj: fullCache(), want: []string{
		"spec.readers[]", "spec.retention.maxAge", "spec.retention.maxSize",
		"status.generation", "status.lastUsed", "status.nodeCount",
		"status.published.generation", "status.published.layers[].covers[]", "status.published.layers[].diffID",
		"status.published.layers[].digest", "status.published.layers[].generation",
		"status.published.layers[].index", "status.published.layers[].indexSize", "status.published.layers[].mediaType",
		"status.published.layers[].node", "status.published.layers[].size", "status.published.repository", "status.published.secret",
		"status.seededFrom", "status.size",
	}}, {name: "CacheReplica", obj: fullReplica(), want: []string{
		"spec.cache", "spec.node",
		"status.filling", "status.generation", "status.lastUsed", "status.lastWriter", "status.layers", "status.publishError",
		"status.seededFrom.generation", "status.seededFrom.name", "status.seededFrom.namespace",
		"status.sizeBytes", "status.unpublished",
	}}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := jsonFields(t, tt.obj); !slices.Equal(got, tt.want) {
				t.Errorf("JSON fields\n got %s\nwant %s", strings.Join(got, " "), strings.Join(tt.want, " "))
			}
		})
	}
}

func TestSchemeRoundTrip(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, in := range []runtime.Object{fullCache(), fullReplica()} {
		kind := in.GetObjectKind().GroupVersionKind()
		gvks, _, err := scheme.ObjectKinds(in)
		if err != nil || len(gvks) != 1 || gvks[0] != kind {
			t.Fatalf("ObjectKinds = %v, %v; want %s", gvks, err, kind)
		}
		out := in.DeepCopyObject()
		if !equality.Semantic.DeepEqual(in, out) {
			t.Errorf("%s: DeepCopy differs: %+v", kind.Kind, out)
		}
	}
	in := fullReplica()
	out := in.DeepCopy()
	out.Status.LastUsed.Time = out.Status.LastUsed.Add(1)
	if in.Status.LastUsed.Equal(out.Status.LastUsed) {
		t.Errorf("DeepCopy shares LastUsed with the original")
	}
}

func TestCacheReplicaNames(t *testing.T) {
	long := strings.Repeat("n", 253) // the longest node name
	tests := []struct {
		cache, node, wantName, wantLabel string
	}{
		{cache: "maven", node: "worker-1", wantName: "maven.worker-1", wantLabel: "worker-1"},
		{cache: "go", node: "ip-10-0-0-1.ec2.internal", wantName: "go.ip-10-0-0-1.ec2.internal", wantLabel: "ip-10-0-0-1.ec2.internal"},
		{cache: "go", node: long, wantName: "go." + shortHash(long), wantLabel: shortHash(long)},
	}
	for _, tt := range tests {
		if got := CacheReplicaName(tt.cache, tt.node); got != tt.wantName {
			t.Errorf("CacheReplicaName(%q, %q) = %q, want %q", tt.cache, tt.node, got, tt.wantName)
		}
		if got := ReplicaNodeLabel(tt.node); got != tt.wantLabel {
			t.Errorf("ReplicaNodeLabel(%q) = %q, want %q", tt.node, got, tt.wantLabel)
		}
	}
	if a, b := shortHash("node-a"), shortHash("node-b"); a == b || len(a) != 17 {
		t.Errorf("shortHash gives %q and %q: want distinct, 17 characters", a, b)
	}
}
