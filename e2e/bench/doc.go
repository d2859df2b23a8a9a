// Package bench measures layercache against a peer,
// rancher/local-path-provisioner, on the local e2e cluster in one run
// (`make bench-e2e`, which runs e2e/bench/run.sh and TestBenchPeer).
// The same run measures layercache's CSI inline volumes, plain and of
// the registry's StorageClass, against an emptyDir and a hostPath
// (TestBenchCSI, csi.go; docs/performance.md, "CSI inline volumes"): what
// follows is TestBenchPeer's.
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
//  3. layercache: exit; the node agent commits the volume as soon as the
//     kubelet reports the pod ended (every container stopped). local-path:
//     copy the changes back into the store (cp -a -u, rsync's quick check:
//     only files that are new or newer are copied), then sync -f, so that
//     the commit is as durable as layercache's (layerfs syncs the
//     filesystem once per commit).
//
// As soon as the test sees the build pod ended it submits the next pod
// that names the same cache (and, for local-path, the same store
// directory), as a CI system starts the next build. That pod runs
// NextScript: step 1 as above (nothing for layercache, the copy in for
// local-path), then it checks that the cache holds the build pod's output
// and exits. A run is this pair of pods.
//
// Two cases: an empty cache (a new cache per run: a new layercache cache
// name, a new store directory for local-path) and a cache of 1 GiB in
// 50,000 files in 50 directories, seeded once per system by the same
// generator and then shared by the runs of that case, each run adding its
// output, as consecutive builds do. The runs of both systems alternate, one
// at a time, so that drift on the machine hits both alike. A run ends by
// deleting its two pods and waiting until their volumes are gone: a
// generic ephemeral volume's claim and PV go away only with its pod (for
// layercache the commit happened at the pod's end already, the PV's
// deletion only cleans up). Then the node's dirty pages are flushed, so
// that no run pays for another one's writeback.
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
// node's CacheReplica of the cache reach a newer generation: the
// container's exit, the kubelet's report that the pod ended, the node
// agent's commit (including its syncfs) and its status report all lie
// inside. For local-path it is the marker "committed", after the copy back
// and sync.
//
// MetricCopyBack, local-path only: from "built" to the marker "copied",
// the copy back without the sync. It is compared with layercache's
// MetricCommit, to show what durability costs the peer.
//
// MetricNext, "pod ended → next pod runs on the new content": from the
// moment the test's watch sees the build pod ended (phase Succeeded and no
// container running, what layercache's node agent waits for too; the test
// submits the next pod right then) to the next pod's marker "warm", which
// it prints once its container runs and has found the build's output in
// its cache (for local-path after copying the cache in). For layercache
// the span holds the commit racing the next pod's scheduling and
// provisioning: a volume provisioned before the commit lands is a view of
// the previous generation, and its pod prints "stale" instead. Stale runs
// are counted and reported, not timed. local-path's copy back happens
// before its pod ends, so it is not in this span; MetricBuiltNext is.
//
// MetricBuiltNext, "build done → next pod runs on the new content": from
// the build pod's "built" to the next pod's "warm", the whole gap between
// two builds as a CI pipeline sees it.
//
// # API writes
//
// Both of layercache's processes serve controller-runtime's client metric
// rest_client_requests_total (by method, code and host) on their metrics
// port; the test reads it through the API server's pod proxy from the node
// agent of its node and every manager replica, before it submits a run's
// build pod and again after the run's pods and volumes are gone (and a
// second more). The difference in POST, PUT, PATCH and DELETE is what
// layercache wrote for the run's two pods, plus the background: the
// manager's leader election renews its Lease by PUT every 2 s, and other
// tests on the cluster have their own pods. The background rate is
// measured the same way over each local-path run, in which layercache has
// no part. The results show per case, component and method the median per
// layercache run, the fewest in one run (other tenants only ever add), the
// background per second and the net per pod: the median over runs of
// (writes − background rate × run length) / 2. A
// component whose metrics cannot be read (the multi-node overlay turns the
// node agents' off) is reported as such, never guessed.
//
// Medians over BENCH_RUNS runs (default 5) per system, case and metric are
// reported with the ratio local-path / layercache: above 1 layercache is
// faster. The results go to the test log, results.txt and results.json in
// BENCH_OUTPUT (run.sh: _output/bench).
package bench
