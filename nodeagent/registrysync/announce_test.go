package registrysync

import (
	"context"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// A commit into a cache without a published chain (no registry) costs no
// read of the API server on its path: announce looks at the informer's
// copy first, and only a chain there is worth a live read.
func TestAnnounceWithoutAChainReadsNothingLive(t *testing.T) {
	tests := []struct {
		name     string
		cache    *v1alpha1.Cache
		wantLive bool
	}{
		{name: "no chain", cache: &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "go"}}},
		{name: "no Cache"},
		{name: "a chain", wantLive: true, cache: &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "go"},
			Status: v1alpha1.CacheStatus{Published: &v1alpha1.PublishedChain{Repository: "registry.example:5000/go"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var objs []client.Object
			if tt.cache != nil {
				objs = append(objs, tt.cache)
			}
			scheme, err := bootstrap.Scheme()
			if err != nil {
				t.Fatal(err)
			}
			cached := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
			var live atomic.Int64
			reader := interceptor.NewClient(cached.(client.WithWatch), interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					live.Add(1)
					return c.Get(ctx, key, obj, opts...)
				},
			})
			s := New(Config{Node: "node-a", Caches: &kit.Caches{Client: cached, Reader: reader, Node: "node-a"}})
			s.Announce(t.Context(), layerfs.CacheRef{Namespace: "ci", Name: "go"}, "pvc-1")
			if got := live.Load() > 0; got != tt.wantLive {
				t.Errorf("%d live reads of the Cache, want any: %v", live.Load(), tt.wantLive)
			}
			if !s.inFlight["pvc-1"] {
				t.Error("the volume is not in flight after announce")
			}
		})
	}
}
