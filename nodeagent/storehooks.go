package nodeagent

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// storeHooks are what the store tells the agent from its background work
// (layers mounted before their bytes were here). The store opens before
// the parts the hooks report through exist, so they are bound later
// (bind); until then the hooks only log.
type storeHooks struct {
	log logr.Logger

	mu      sync.Mutex
	caches  *kit.Caches
	events  events.EventRecorder
	reports *kit.CacheQueue
}

func (h *storeHooks) bind(caches *kit.Caches, events events.EventRecorder, reports *kit.CacheQueue) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.caches, h.events, h.reports = caches, events, reports
}

func (h *storeHooks) parts() (*kit.Caches, events.EventRecorder, *kit.CacheQueue) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.caches, h.events, h.reports
}

// lazyReadFailed puts a Warning Event on the Cache whose layer failed a
// read. It runs on the read's goroutine, so the Event is made on another.
func (h *storeHooks) lazyReadFailed(ref layerfs.CacheRef, digest string, err error) {
	caches, recorder, _ := h.parts()
	if caches == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cache, gerr := caches.Get(ctx, ref)
		if gerr != nil || cache == nil {
			h.log.Error(gerr, "Read the Cache to report a failed read of a layer fetched on demand", "cache", ref.String())
			return
		}
		recorder.Eventf(cache, nil, corev1.EventTypeWarning, kit.ReasonLazyFetchFailed, kit.ActionPull,
			"a read of layer %s of cache %s on node %s failed: %v; builds reading it fail, and their volumes are discarded at their end. Check that the cache's registry is reachable from the node (its copy completes once it is), or set the class's mountFirst to \"false\" to fetch whole layers before builds start",
			digest, ref, caches.Node, err)
	}()
}

// lazyComplete reports the cache whose layer settled: its replica's
// filling count went down.
func (h *storeHooks) lazyComplete(ref layerfs.CacheRef) {
	if _, _, reports := h.parts(); reports != nil {
		reports.Add(ref)
	}
}
