package nodeagent

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/layerfs"
)

// queueRetries bounds how often a failed item is retried before it waits
// for the next periodic pass to queue it again.
const queueRetries = 5

// cacheQueue runs one operation per cache, one cache at a time, off the
// critical path. A cache queued again while it waits runs once.
type cacheQueue struct {
	name  string
	queue workqueue.TypedRateLimitingInterface[layerfs.CacheRef]
	do    func(context.Context, layerfs.CacheRef) error
}

func newCacheQueue(name string, do func(context.Context, layerfs.CacheRef) error) *cacheQueue {
	return &cacheQueue{
		name: name,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[layerfs.CacheRef](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[layerfs.CacheRef]{Name: name}),
		do: do,
	}
}

// Add queues a cache; on a nil queue it does nothing.
func (q *cacheQueue) Add(ref layerfs.CacheRef) {
	if q != nil {
		q.queue.Add(ref)
	}
}

// Run works the queue until ctx ends.
func (q *cacheQueue) Run(ctx context.Context) {
	logger := log.FromContext(ctx).WithValues("queue", q.name)
	go func() {
		<-ctx.Done()
		q.queue.ShutDown()
	}()
	for {
		ref, shutdown := q.queue.Get()
		if shutdown {
			return
		}
		err := q.do(ctx, ref)
		switch {
		case err == nil:
			q.queue.Forget(ref)
		case ctx.Err() != nil:
			q.queue.Forget(ref)
		case q.queue.NumRequeues(ref) < queueRetries:
			logger.Error(err, "Retrying", "cache", ref.String())
			q.queue.AddRateLimited(ref)
		default:
			logger.Error(err, "Giving up until the next periodic pass", "cache", ref.String())
			q.queue.Forget(ref)
		}
		q.queue.Done(ref)
	}
}
