package kit

import (
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// maven is the cache the statuses below are of.
var maven = layerfs.CacheRef{Namespace: "ci", Name: "maven"}

func TestReplicaApply(t *testing.T) {
	used := time.Date(2026, 3, 1, 12, 30, 45, 999, time.UTC)
	info := layerfs.CacheInfo{Cache: maven, Generation: 3, Layers: make([]layerfs.LayerInfo, 2), Bytes: 4096, LastUsed: used, LastWriter: "ci/build-1"}
	got, err := json.Marshal(v1alpha1.CacheReplicaApply("ci", "maven", "uid-1", "node-a", replicaStatus(info, nil)))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kind":"CacheReplica","apiVersion":"layercache.dev/v1alpha1","metadata":{"name":"maven.node-a","namespace":"ci",` +
		`"labels":{"layercache.dev/cache":"maven","layercache.dev/node":"node-a"},` +
		`"ownerReferences":[{"apiVersion":"layercache.dev/v1alpha1","kind":"Cache","name":"maven","uid":"uid-1"}]},` +
		`"spec":{"cache":"maven","node":"node-a"},` +
		`"status":{"generation":3,"layers":2,"sizeBytes":4096,"lastUsed":"2026-03-01T12:30:45Z","lastWriter":"ci/build-1"}}`
	if string(got) != want {
		t.Errorf("apply body\n got %s\nwant %s", got, want)
	}

	// A copy created on a fallback's layers says which, at which
	// generation; the manager derives status.seededFrom from it.
	info.SeededFrom = &layerfs.Seed{Cache: layerfs.CacheRef{Namespace: "trusted", Name: "main"}, Generation: 7}
	got, err = json.Marshal(replicaStatus(info, nil).SeededFrom)
	if want := `{"namespace":"trusted","name":"main","generation":7}`; err != nil || string(got) != want {
		t.Errorf("seededFrom = %s, %v; want %s", got, err, want)
	}
}

// A report sends nothing when the replica already says what the API
// server would store (times to the second): the periodic pass then
// writes nothing.
func TestSameStatus(t *testing.T) {
	used := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	stored := v1alpha1.CacheReplicaStatus{Generation: 2, SizeBytes: 512, LastUsed: &metav1.Time{Time: used}}
	same := stored
	same.LastUsed = &metav1.Time{Time: used.Add(999 * time.Millisecond)}
	newer := stored
	newer.Generation = 3
	unused := stored
	unused.LastUsed = nil
	tests := []struct {
		name string
		next v1alpha1.CacheReplicaStatus
		want bool
	}{
		{"the stored state, to the second", same, true},
		{"a new generation", newer, false},
		{"no last use", unused, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameStatus(stored, tt.next); got != tt.want {
				t.Errorf("sameStatus = %v, want %v", got, tt.want)
			}
		})
	}
}
