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
			Nodes: []NodeCacheStatus{{Node: "n1", Generation: 2, Layers: 2, SizeBytes: 10, LastUsed: &now, LastWriter: "ci/ws", Unpublished: 1,
				SeededFrom: &CacheSeed{Namespace: "ci", Name: "main", Generation: 7}}},
			Generation: 2, Size: "10B", NodeCount: 1, LastUsed: &now, SeededFrom: "ci/main@7",
			Published: &PublishedChain{Repository: "reg.example/caches/ci/maven", Secret: "creds", Generation: 1, Layers: []PublishedLayer{{
				Digest: "sha256:aa", DiffID: "sha256:bb", MediaType: "application/vnd.oci.image.layer.v1.tar+zstd", Size: 3, Generation: 1, Node: "n1", Covers: []string{"sha256:cc"},
			}}},
		},
	}
}

// The JSON field names are the contract with the node agent (server-side
// apply of status.nodes), kubectl printer columns and users' manifests.
func TestCacheJSONFields(t *testing.T) {
	data, err := json.Marshal(fullCache())
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
	walk("", m["spec"])
	walk("status", m["status"])
	slices.Sort(got)
	want := []string{
		".readers[]", ".retention.maxAge", ".retention.maxSize",
		"status.generation", "status.lastUsed", "status.nodeCount",
		"status.nodes[].generation", "status.nodes[].lastUsed", "status.nodes[].lastWriter",
		"status.nodes[].layers", "status.nodes[].node",
		"status.nodes[].seededFrom.generation", "status.nodes[].seededFrom.name", "status.nodes[].seededFrom.namespace",
		"status.nodes[].sizeBytes", "status.nodes[].unpublished",
		"status.published.generation", "status.published.layers[].covers[]", "status.published.layers[].diffID",
		"status.published.layers[].digest", "status.published.layers[].generation", "status.published.layers[].mediaType",
		"status.published.layers[].node", "status.published.layers[].size", "status.published.repository", "status.published.secret",
		"status.seededFrom", "status.size",
	}
	if !slices.Equal(got, want) {
		t.Errorf("JSON fields\n got %s\nwant %s", strings.Join(got, " "), strings.Join(want, " "))
	}
}

func TestSchemeRoundTrip(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	in := fullCache()
	gvks, _, err := scheme.ObjectKinds(in)
	if err != nil || len(gvks) != 1 || gvks[0] != GroupVersion.WithKind("Cache") {
		t.Fatalf("ObjectKinds = %v, %v; want %s", gvks, err, GroupVersion.WithKind("Cache"))
	}
	out := in.DeepCopy()
	if !equality.Semantic.DeepEqual(in, out) {
		t.Errorf("DeepCopy differs: %+v", out)
	}
	out.Status.Nodes[0].LastUsed.Time = out.Status.Nodes[0].LastUsed.Add(1)
	if in.Status.Nodes[0].LastUsed.Equal(out.Status.Nodes[0].LastUsed) {
		t.Errorf("DeepCopy shares LastUsed with the original")
	}
}
