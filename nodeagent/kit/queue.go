package kit

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

// CacheQueue runs one operation per cache off the critical path, on
// workers caches at a time, never twice at once on one cache. A cache
// queued again while it waits runs once.
type CacheQueue struct {
	name    string
	workers int
	Queue   workqueue.TypedRateLimitingInterface[layerfs.CacheRef]
}

// NewCacheQueue makes a queue that Run works; the parts that feed it are
// given it before the part that works it exists.
func NewCacheQueue(name string, workers int) *CacheQueue {
	return &CacheQueue{
		name: name, workers: workers,
		Queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[layerfs.CacheRef](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[layerfs.CacheRef]{Name: name}),
	}
}

// Add queues a cache; on a nil queue it does nothing.
func (q *CacheQueue) Add(ref layerfs.CacheRef) {
	if q != nil {
		q.Queue.Add(ref)
	}
}

// Run works the queue with do until ctx ends.
func (q *CacheQueue) Run(ctx context.Context, do func(context.Context, layerfs.CacheRef) error) {
	go func() {
		<-ctx.Done()
		q.Queue.ShutDown()
	}()
	var wg sync.WaitGroup
	for range q.workers {
		wg.Go(func() { q.work(ctx, do) })
	}
	wg.Wait()
}

func (q *CacheQueue) work(ctx context.Context, do func(context.Context, layerfs.CacheRef) error) {
	logger := log.FromContext(ctx).WithValues("queue", q.name)
	for {
		ref, shutdown := q.Queue.Get()
		if shutdown {
			return
		}
		err := do(ctx, ref)
		switch {
		case err == nil:
			q.Queue.Forget(ref)
		case ctx.Err() != nil:
			q.Queue.Forget(ref)
		case q.Queue.NumRequeues(ref) < queueRetries:
			logger.Error(err, "Retrying", "cache", ref.String())
			q.Queue.AddRateLimited(ref)
		default:
			logger.Error(err, "Giving up until the next periodic pass", "cache", ref.String())
			q.Queue.Forget(ref)
		}
		q.Queue.Done(ref)
	}
}

// KeyQueue is a queue of NAMESPACE/NAME keys whose failures are retried
// from 1 s up to every 2 minutes, as long as it takes: a build's end that
// failed keeps the volume's changes until it lands. It remembers when each
// key was first queued, so that a worker can tell how long the key waited
// (the volume end delay metric), retries included.
type KeyQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	mu     sync.Mutex
	queued map[string]time.Time // first Add since a worker last took the key
}

func NewKeyQueue(name string) *KeyQueue {
	return &KeyQueue{
		TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 2*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name}),
		queued: map[string]time.Time{},
	}
}

// Add queues key, noting the time unless it waits already.
func (q *KeyQueue) Add(key string) {
	q.note(key, time.Now())
	q.TypedRateLimitingInterface.Add(key)
}

func (q *KeyQueue) note(key string, at time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.queued[key]; !ok {
		q.queued[key] = at
	}
}

// take returns when key was first queued since it was last taken, and
// forgets it: an Add while a worker has the key notes a new time.
func (q *KeyQueue) take(key string) (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	at, ok := q.queued[key]
	delete(q.queued, key)
	return at, ok
}

// queuedAtKey is the context key of the time a worker's key was first
// queued.
type queuedAtKey struct{}

// QueuedAt returns the time the key a worker does was first queued, if
// the work came from a KeyQueue.
func QueuedAt(ctx context.Context) (time.Time, bool) {
	at, ok := ctx.Value(queuedAtKey{}).(time.Time)
	return at, ok
}

// WorkKeys does the keys of q with workers goroutines until ctx ends,
// logging a failure as failed (with the key as keyName) and retrying it.
// do finds the time its key was first queued with queuedAt.
func WorkKeys(ctx context.Context, q *KeyQueue, workers int, failed, keyName string, do func(context.Context, string) error) {
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
