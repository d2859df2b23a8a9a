// Package bench measures layercache against a peer,
// rancher/local-path-provisioner, on the local e2e cluster in one run
// (`make bench-e2e`, which runs e2e/bench/run.sh and TestBenchPeer).
//
// # Workload
//
// Both systems run the same build pod: the busybox image, one container,
// one generic ephemeral volume mounted at /cache (StorageClass layercache
// with the annotation layercache.dev/cache, or local-path-bench), pinned
// to one node with a node selector so that the scheduler binds the volume
// as it would for any user. The container runs Script:
//
//  1. layercache: nothing to do, the volume is the warm cache.
//     local-path: copy the cache from the cache store into the fresh volume
//     (cp -a), as users of copy-based caches do. The store is a long-lived
//     local-path claim of the same node, mounted at /store.
//  2. the build step: check that the cache is warm (the seed and the
//     previous run's output are there), then write 1 MiB and 100 small
//     files into /cache/runs/RUN.
//  3. layercache: exit; the node agent commits the volume when the pod has
//     ended. local-path: copy the changes back into the store (cp -a -u,
//     rsync's quick check: only files that are new or newer are copied),
//     then sync -f, so that the commit is as durable as layercache's
//     (layerfs syncs the filesystem once per commit).
//
// Two cases: an empty cache (a new cache per run: a new layercache cache
// name, a new store directory for local-path) and a cache of 1 GiB in
// 50,000 files in 50 directories, seeded once per system by the same
// generator and then shared by the runs of that case, each run adding its
// output, as consecutive builds do. The runs of both systems alternate, one
// at a time, so that drift on the machine hits both alike; between runs the
// benchmark waits until the previous run's volume is gone and flushes the
// node's dirty pages, so that no run pays for another one's writeback.
//
// # Metrics
//
// The script prints markers "BENCH <name> <unix seconds>" from the node's
// clock, which is the benchmark's clock: the local cluster runs on the
// machine that runs the test. Kubernetes timestamps have a resolution of a
// second, too coarse here, so none is used.
//
// MetricStart, "claim created → build can start": from the moment the
// test submits the pod (whose generic ephemeral volume makes the claim) to
// the marker "ready", printed when the build step can start with a warm
// cache: at container start for layercache, after the copy into the volume
// for local-path. It includes scheduling, provisioning (local-path runs a
// helper pod), the kubelet's mount, the container start and the copy.
//
// MetricCommit, "build done → cache committed": from the marker "built"
// (the build step is done; layercache's container exits right after it) to
// the moment the next build would see the changes durably stored. For
// layercache that is when the benchmark observes, through a watch, the
// Cache's status entry of the node reach a newer generation: the pod's
// end, the manager's release of the claim, the node agent's commit
// (including its syncfs) and its status report all lie inside. For
// local-path it is the marker "committed", after the copy back and sync.
//
// MetricCopyBack, local-path only: from "built" to the marker "copied",
// the copy back without the sync. It is compared with layercache's
// MetricCommit, to show what durability costs the peer.
//
// Medians over BENCH_RUNS runs (default 5) per system, case and metric are
// reported with the ratio local-path / layercache: above 1 layercache is
// faster. The results go to the test log, results.txt and results.json in
// BENCH_OUTPUT (run.sh: _output/bench).
package bench
