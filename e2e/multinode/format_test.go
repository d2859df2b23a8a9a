//go:build e2e && multinode

package multinode

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Layers travel as EROFS images that the receiving node mounts: what a
// build makes crosses nodes as it is, with nothing unpacked or
// translated on the way.

// hundred sets h to 100 levels of the deep tree, d/d/.../d, in shell.
const hundred = `h=d; for i in $(seq 99); do h=$h/d; done`

// TestFilesCrossNodesIntact: a socket (as gpg-agent and Gradle daemons
// leave them), files named like OCI whiteouts, and a tree deeper than
// PATH_MAX, made on node A, are the same on node B.
func TestFilesCrossNodesIntact(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)

	// busybox's syslogd binds its socket where /dev/log points; cd -P
	// does not build a path past PATH_MAX from $PWD. The tree goes down
	// 100 levels (d/d/.../d) at a time: each cd -P asks for the working
	// directory, which past PATH_MAX costs a walk up the whole tree, and
	// 2,100 single steps took minutes on a slow node.
	script := `mkdir -p /cache/run /cache/img/d
ln -sf /cache/run/agent.sock /dev/log; syslogd -n -O /dev/null & sleep 1; kill $!; test -S /cache/run/agent.sock
echo kept > /cache/img/keep; : > /cache/img/.wh.keep; echo opq > /cache/img/d/.wh..wh..opq; echo inside > /cache/img/d/file
` + hundred + `; cd /cache; for i in $(seq 21); do mkdir -p $h; cd -P $h; done; echo deep > leaf`
	e.run(ctx, e.buildPod("make", a, "odd-files", "", script))
	e.waitPublished(ctx, "odd-files", 1)

	check := `test -S /cache/run/agent.sock && echo socket
cat /cache/img/keep /cache/img/.wh.keep /cache/img/d/.wh..wh..opq /cache/img/d/file
` + hundred + `; cd /cache; for i in $(seq 21); do cd -P $h; done; cat leaf`
	out := e.run(ctx, e.buildPod("check", b, "odd-files", "", check))
	if got, want := strings.Fields(out), []string{"socket", "kept", "opq", "inside", "deep"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("node %s sees %q, want %q: the socket, keep beside .wh.keep, d/ with its .wh..wh..opq, and the leaf 2,100 levels down", b, got, want)
	}
}

// TestSparseFileCrossesNodesSparse: a 1 TiB sparse file with data at
// 512 GiB is a small blob, takes no more than 1 MiB on the other node, and
// its data reads back there. With tars it took its full size on every
// node that pulled it.
func TestSparseFileCrossesNodesSparse(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)

	e.run(ctx, e.buildPod("make", a, "sparse", "", "truncate -s 1099511627776 /cache/big; echo at-512g | dd of=/cache/big bs=1M seek=524288 conv=notrunc 2>/dev/null"))
	c := e.waitPublished(ctx, "sparse", 1)
	if size := c.Status.Published.Layers[0].Size; size > 1<<20 {
		t.Errorf("the blob of a 1 TiB sparse file is %d bytes, want at most 1 MiB", size)
	}
	out := e.run(ctx, e.buildPod("read", b, "sparse", "", "stat -c %s /cache/big; dd if=/cache/big bs=1M skip=524288 count=1 2>/dev/null | head -c 7"))
	if got := strings.Fields(out); len(got) != 2 || got[0] != "1099511627776" || got[1] != "at-512g" {
		t.Fatalf("node %s reads %q, want the size 1099511627776 and at-512g", b, out)
	}
	used := e.cacheImagesUsage(b, "sparse")
	t.Logf("node %s: the layer images of cache sparse take %d bytes", b, used)
	if used > 1<<20 {
		t.Errorf("node %s's layer images of cache sparse take %d bytes for a 1 TiB sparse file, want at most 1 MiB", b, used)
	}
}

// cacheImagesUsage is what the layer images of cache (in the scenario's
// namespace) take on node's disk. It reads the cache's head on the node
// rather than measuring the whole images directory, which the scenarios
// running beside this one fill at the same time.
func (e *syncEnv) cacheImagesUsage(node, cache string) int64 {
	e.t.Helper()
	n, err := e.Cluster.Node(node)
	if err != nil {
		e.t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(n.HostRoot, "caches", e.Namespace, cache, "head.json"))
	if err != nil {
		e.t.Fatalf("node %s has no head of cache %s: %v", node, cache, err)
	}
	var head struct {
		Layers []struct {
			ID string `json:"id"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		e.t.Fatalf("node %s's head of cache %s: %v", node, cache, err)
	}
	var total int64
	for _, l := range head.Layers {
		// A layer mounted first is an image once its copy is complete.
		var st syscall.Stat_t
		img := filepath.Join(n.HostRoot, "images", l.ID)
		err := wait.PollUntilContextTimeout(e.t.Context(), pollInterval, time.Minute, true, func(context.Context) (bool, error) {
			return syscall.Stat(img, &st) == nil, nil
		})
		if err != nil {
			e.t.Fatalf("node %s has no image of layer %s of cache %s within 1m: %v", node, l.ID, cache, err)
		}
		total += st.Blocks * 512
	}
	return total
}
