package volumes

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/layercache/layercache/internal/benchsize"
	"github.com/layercache/layercache/nodeagent/kit"
)

// BenchmarkHandoffAcrossNodes is read-your-writes across nodes, timed: a
// build on node A ends with a delta of 4 KiB, 64 MiB or 1 GiB (random
// bytes, one file; at smoke size 4 KiB and 64 MiB only: the 1 GiB
// handoff's 12-15 s would be a fifth of make bench-smoke's minute), and
// at that moment a claim of the same cache is provisioned on node B.
// Two agents over real stores, one API (a fake client) and the in-process
// registry, as in sync_test.go; the reader's class waits up to 5 minutes,
// as the in-process registry takes a minute to take in a 1 GiB blob (it
// grows a buffer per upload chunk). Per size:
//   - handoff-SIZE-s: A's build end (commit and announce) until B's volume
//     is mounted with A's delta in it;
//   - publish-SIZE-s: A's publish (export, push, append), run at the same
//     time as the agent's queue runs it;
//   - handoff/publish-SIZE: what the reader adds to the publish it waits
//     for (re-reading the Cache, then the pull), as a ratio;
//   - added-SIZE-s: the same in seconds, which is what counts for a small
//     delta: its publish takes tens of milliseconds, and the reader's poll
//     of the Cache every 250 ms is most of what it adds.
func BenchmarkHandoffAcrossNodes(b *testing.B) {
	c := newSyncCluster(b)
	c.request = "2Gi" // the claims' bound on a build's delta and a pulled layer
	sizes := []int64{4 << 10, 64 << 20, 1 << 30}
	if benchsize.Smoke(b) {
		sizes = sizes[:2]
	}
	for _, n := range sizes {
		size := benchsize.Bytes(n) // 64MiB: the metrics name the size that ran
		pv := c.provision(b, "node-a", "writer-"+strings.ToLower(size))
		writeRandomFile(b, filepath.Join(pv.Spec.HostPath.Path, "delta"), n)
		writeFile(b, pv, "mark", size)

		start := time.Now()
		c.end(b, "node-a", pv)
		published := make(chan time.Duration, 1)
		go func() {
			if err := c.nodes["node-a"].sync.Publish(context.Background(), maven); err != nil {
				b.Error(err)
			}
			published <- time.Since(start)
		}()
		reader := c.provisionWith(b, "node-b", "reader-"+strings.ToLower(size), map[string]string{kit.ParamSyncTimeout: "5m"})
		handoff := time.Since(start)
		publish := <-published

		mark, err := os.ReadFile(filepath.Join(reader.Spec.HostPath.Path, "mark"))
		if err != nil || !bytes.Equal(mark, []byte(size)) {
			b.Fatalf("%s delta: node-b's volume has mark %q (%v), want %q after %v (publish %v): it mounted without node-a's commit; node-b's events: %q",
				size, mark, err, size, handoff, publish, drain(c.nodes["node-b"]))
		}
		b.ReportMetric(handoff.Seconds(), "handoff-"+size+"-s")
		b.ReportMetric(publish.Seconds(), "publish-"+size+"-s")
		b.ReportMetric(handoff.Seconds()/publish.Seconds(), "handoff/publish-"+size)
		b.ReportMetric((handoff - publish).Seconds(), "added-"+size+"-s")
	}
}

// writeRandomFile writes n random bytes to path, durably.
func writeRandomFile(t testing.TB, path string, n int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.CopyN(f, rand.NewChaCha8([32]byte{1}), n); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}
