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

// cacheQueue runs one operation per cache off the critical path, on
// workers caches at a time, never twice at once on one cache. A cache
// queued again while it waits runs once.
type cacheQueue struct {
	name    string
	workers int
	queue   workqueue.TypedRateLimitingInterface[layerfs.CacheRef]
	do      func(context.Context, layerfs.CacheRef) error
}

func newCacheQueue(name string, workers int, do func(context.Context, layerfs.CacheRef) error) *cacheQueue {
	return &cacheQueue{
		name: name, workers: workers,
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
	go func() {
		<-ctx.Done()
		q.queue.ShutDown()
	}()
	var wg sync.WaitGroup
	for range q.workers {
		wg.Go(func() { q.work(ctx) })
	}
	wg.Wait()
}

func (q *cacheQueue) work(ctx context.Context) {
	logger := log.FromContext(ctx).WithValues("queue", q.name)
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

// publishWorkers bounds the caches published at once. A layer's publish
// waits mostly on the registry and the API server, so a backlog over
// several caches (after a registry outage) goes out that many times
// faster; a cache's own layers go in order, by one worker.
const publishWorkers = 4

func newWorkQueues(maint *maintainer, sync *syncer) workQueues {
	return workQueues{
		reports:   newCacheQueue("report", 1, maint.report),
		squashes:  newCacheQueue("squash", 1, maint.squash),
		publishes: newCacheQueue("publish", publishWorkers, sync.publish),
	}
}

// run works every queue, each on its own goroutine, until ctx ends.
func (q workQueues) run(ctx context.Context) {
	go q.reports.Run(ctx)
	go q.squashes.Run(ctx)
	go q.publishes.Run(ctx)
}

// keyQueue is a queue of NAMESPACE/NAME keys whose failures are retried
// from 1 s up to every 2 minutes, as long as it takes: a build's end that
// failed keeps the volume's changes until it lands. It remembers when each
// key was first queued, so that a worker can tell how long the key waited
// (the volume end delay metric), retries included.
type keyQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	mu     sync.Mutex
	queued map[string]time.Time // first Add since a worker last took the key
}

func newKeyQueue(name string) *keyQueue {
	return &keyQueue{
		TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 2*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name}),
		queued: map[string]time.Time{},
	}
}

// Add queues key, noting the time unless it waits already.
func (q *keyQueue) Add(key string) {
	q.note(key, time.Now())
	q.TypedRateLimitingInterface.Add(key)
}

func (q *keyQueue) note(key string, at time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.queued[key]; !ok {
		q.queued[key] = at
	}
}

// take returns when key was first queued since it was last taken, and
// forgets it: an Add while a worker has the key notes a new time.
func (q *keyQueue) take(key string) (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	at, ok := q.queued[key]
	delete(q.queued, key)
	return at, ok
}

// queuedAtKey is the context key of the time a worker's key was first
// queued.
type queuedAtKey struct{}

// queuedAt returns the time the key a worker does was first queued, if
// the work came from a keyQueue.
func queuedAt(ctx context.Context) (time.Time, bool) {
	at, ok := ctx.Value(queuedAtKey{}).(time.Time)
	return at, ok
}

// workKeys does the keys of q with workers goroutines until ctx ends,
// logging a failure as failed (with the key as keyName) and retrying it.
// do finds the time its key was first queued with queuedAt.
func workKeys(ctx context.Context, q *keyQueue, workers int, failed, keyName string, do func(context.Context, string) error) {
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
				keyCtx := ctx
				at, noted := q.take(key)
				if noted {
					keyCtx = context.WithValue(ctx, queuedAtKey{}, at)
				}
				if err := do(keyCtx, key); err != nil {
					log.FromContext(ctx).Error(err, failed, keyName, key)
					if noted {
						q.note(key, at) // a retry's wait counts from the first
					}
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
