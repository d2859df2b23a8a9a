//go:build e2e && multinode

package multinode

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Layers travel as EROFS images that the receiving node mounts: what a
// build makes crosses nodes as it is, with nothing unpacked or
// translated on the way.

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
	// does not build a path past PATH_MAX from $PWD.
	script := `mkdir -p /cache/run /cache/img/d
ln -sf /cache/run/agent.sock /dev/log; syslogd -n -O /dev/null & sleep 1; kill $!; test -S /cache/run/agent.sock
echo kept > /cache/img/keep; : > /cache/img/.wh.keep; echo opq > /cache/img/d/.wh..wh..opq; echo inside > /cache/img/d/file
cd /cache; for i in $(seq 2100); do mkdir d; cd -P d; done; echo deep > leaf`
	e.run(ctx, e.buildPod("make", a, "odd-files", "", script))
	e.waitPublished(ctx, "odd-files", 1)

	check := `test -S /cache/run/agent.sock && echo socket
cat /cache/img/keep /cache/img/.wh.keep /cache/img/d/.wh..wh..opq /cache/img/d/file
cd /cache; for i in $(seq 2100); do cd -P d; done; cat leaf`
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
	before := e.imagesUsage(b)
	out := e.run(ctx, e.buildPod("read", b, "sparse", "", "stat -c %s /cache/big; dd if=/cache/big bs=1M skip=524288 count=1 2>/dev/null | head -c 7"))
	if got := strings.Fields(out); len(got) != 2 || got[0] != "1099511627776" || got[1] != "at-512g" {
		t.Fatalf("node %s reads %q, want the size 1099511627776 and at-512g", b, out)
	}
	if grew := e.imagesUsage(b) - before; grew > 1<<20 {
		t.Errorf("node %s's layer images grew by %d bytes for a 1 TiB sparse file, want at most 1 MiB", b, grew)
	}
}

// imagesUsage is what the layer images of node's store take on disk.
func (e *syncEnv) imagesUsage(node string) int64 {
	e.t.Helper()
	n, err := e.Cluster.Node(node)
	if err != nil {
		e.t.Fatal(err)
	}
	dir := filepath.Join(n.HostRoot, "images")
	entries, err := os.ReadDir(dir)
	if err != nil {
		e.t.Fatalf("node %s's store has no images directory: %v", node, err)
	}
	var total int64
	for _, en := range entries {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, en.Name()), &st); err == nil {
			total += st.Blocks * 512
		}
	}
	return total
}
