package nodeagent

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/layercache/layercache/nodeagent/kit"
)

// newClaimInformers is the informer factory of the provision controller's
// claims (only those that may be node's: nodeClaimInformer) and storage
// classes, none of them with managed fields.
func newClaimInformers(clientset kubernetes.Interface, node string, resync time.Duration) informers.SharedInformerFactory {
	f := informers.NewSharedInformerFactoryWithOptions(clientset, resync, informers.WithTransform(crcache.TransformStripManagedFields()))
	f.InformerFor(&corev1.PersistentVolumeClaim{}, nodeClaimInformer(node))
	return f
}

// nodeClaimInformer is the provision controller's claim informer. The
// provisioner library watches every claim in the cluster (claims cannot be
// selected by node on the server), but an agent only provisions and ends
// the claims of its own node, so a claim the scheduler placed on another
// node never enters its cache: the agent's memory stays flat with the
// number of nodes. Even a stub of each such claim cost about 3 KiB of heap
// a claim, 18 MiB at 5,000 nodes (make scale).
func nodeClaimInformer(node string) func(kubernetes.Interface, time.Duration) cache.SharedIndexInformer {
	return func(clientset kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		// As client-go's own informers: a client that cannot stream the
		// initial list (a fake) lists instead.
		lw := cache.ToListWatcherWithWatchListSemantics(nodeClaims(clientset, node), clientset)
		return cache.NewSharedIndexInformer(lw, &corev1.PersistentVolumeClaim{}, resync,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	}
}

// nodeClaims lists and watches the cluster's claims but passes on only
// those that may be this node's (placed on it, or not placed yet). A claim
// placed on another node is left out of lists, and its watch events arrive
// as deletions (the initial ones of a streamed list too): one that was
// cached while unplaced leaves the cache, and the informer drops the
// deletion of one it never held.
func nodeClaims(clientset kubernetes.Interface, node string) *cache.ListWatch {
	claims := clientset.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list, err := claims.List(ctx, opts)
			if err != nil {
				return nil, err
			}
			// A new slice: the kept claims must not pin the list's array,
			// which holds every claim of the cluster.
			var mine []corev1.PersistentVolumeClaim
			for i := range list.Items {
				if mayBeNodes(&list.Items[i], node) {
					mine = append(mine, list.Items[i])
				}
			}
			list.Items = mine
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := claims.Watch(ctx, opts)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				if c, ok := e.Object.(*corev1.PersistentVolumeClaim); ok && !mayBeNodes(c, node) {
					e.Type = watch.Deleted
				}
				return e, true
			}), nil
		},
	}
}

// mayBeNodes tells whether a claim may be node's: the scheduler placed it
// there, or nowhere yet.
func mayBeNodes(c *corev1.PersistentVolumeClaim, node string) bool {
	selected := c.Annotations[kit.AnnSelectedNode]
	return selected == "" || selected == node
}
