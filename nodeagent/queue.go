package nodeagent

import (
	"context"
	"sync"
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

// workQueues are the agent's three queues of work off the critical path.
// The agent makes and runs them, and hands each part the queues it feeds;
// the queues call the maintainer and the syncer, which do the work. One
// owner keeps the wiring in one place: no part makes a queue another
// part runs.
type workQueues struct {
	// reports applies a cache's CacheReplica (maintainer.report); fed by
	// provisioning, build ends, sync and maintenance.
	reports *cacheQueue
	// squashes merges a deep cache's layers (maintainer.squash); fed by
	// commits and syncs that leave a cache deep.
	squashes *cacheQueue
	// publishes pushes a cache's new layers (syncer.publish); fed by
	// commits and maintenance.
	publishes *cacheQueue
}

func newWorkQueues(maint *maintainer, sync *syncer) workQueues {
	return workQueues{
		reports:   newCacheQueue("report", maint.report),
		squashes:  newCacheQueue("squash", maint.squash),
		publishes: newCacheQueue("publish", sync.publish),
	}
}

// run works every queue, each on its own goroutine, until ctx ends.
func (q workQueues) run(ctx context.Context) {
	go q.reports.Run(ctx)
	go q.squashes.Run(ctx)
	go q.publishes.Run(ctx)
}

// newKeyQueue is a queue of NAMESPACE/NAME keys whose failures are retried
// from 1 s up to every 2 minutes, as long as it takes: a build's end that
// failed keeps the volume's changes until it lands.
func newKeyQueue(name string) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 2*time.Minute),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
}

// workKeys does the keys of q with workers goroutines until ctx ends,
// logging a failure as failed (with the key as keyName) and retrying it.
func workKeys(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], workers int, failed, keyName string, do func(context.Context, string) error) {
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				key, shutdown := q.Get()
				if shutdown {
					return
				}
				if err := do(ctx, key); err != nil {
					log.FromContext(ctx).Error(err, failed, keyName, key)
					q.AddRateLimited(key)
				} else {
					q.Forget(key)
				}
				q.Done(key)
			}
		})
	}
	wg.Wait()
}
