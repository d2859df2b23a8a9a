package nodeagent

import (
	"context"

	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/registrysync"
	"github.com/layercache/layercache/nodeagent/volumes"
)

// workQueues are the agent's three queues of work off the critical path.
// The agent makes and runs them, and hands each part the queues it feeds;
// the queues call the maintainer and the syncer, which do the work. One
// owner keeps the wiring in one place: no part makes a queue another
// part runs.
type workQueues struct {
	// reports applies a cache's CacheReplica (Maintainer.Report); fed by
	// provisioning, build ends, sync and maintenance.
	reports *kit.CacheQueue
	// squashes merges a deep cache's layers (Maintainer.Squash); fed by
	// commits and syncs that leave a cache deep.
	squashes *kit.CacheQueue
	// publishes pushes a cache's new layers (registrysync.Syncer.Publish); fed by
	// commits and maintenance.
	publishes *kit.CacheQueue
}

// publishWorkers bounds the caches published at once. A layer's publish
// waits mostly on the registry and the API server, so a backlog over
// several caches (after a registry outage) goes out that many times
// faster; a cache's own layers go in order, by one worker.
const publishWorkers = 4

func newWorkQueues() workQueues {
	return workQueues{
		reports:   kit.NewCacheQueue("report", 1),
		squashes:  kit.NewCacheQueue("squash", 1),
		publishes: kit.NewCacheQueue("publish", publishWorkers),
	}
}

// run works every queue, each on its own goroutine, until ctx ends.
func (q workQueues) run(ctx context.Context, maint *volumes.Maintainer, sync *registrysync.Syncer) {
	go q.reports.Run(ctx, maint.Report)
	go q.squashes.Run(ctx, maint.Squash)
	go q.publishes.Run(ctx, sync.Publish)
}
