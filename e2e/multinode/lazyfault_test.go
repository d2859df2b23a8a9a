//go:build e2e && multinode

package multinode

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/e2e/framework"
)

// TestRegistryAwayDuringALazyBuild: node B mounts a cache published from
// node A before its bytes are there, and the registry goes away while
// B's copy fills (a proxy of this test's, slowed to 1 MiB/s a
// connection, then stopped). A build on B reads a file not fetched yet: the read waits
// the class's syncTimeout, then fails with EIO; a LazyFetchFailed Event
// on the Cache names the node, and the build's volume is discarded with
// a Warning that says why, though the build succeeded and wrote to the
// cache. Once the registry is back, B's copy completes and a build there
// reads every file as A wrote it, and none of the discarded build's.
func TestRegistryAwayDuringALazyBuild(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)
	proxy := startProxy(t, e.Reg.Address)
	class := e.newClass(ctx, "via-proxy", map[string]string{
		"registry": proxy.addr + "/caches", "registrySecret": e.proxySecret(ctx, proxy.addr), "syncTimeout": "5s",
	})

	write := `mkdir -p /cache/data; for i in $(seq 64); do head -c 1048576 /dev/urandom > /cache/data/$i; done
echo hello > /cache/small.txt; cd /cache/data && md5sum * | md5sum | cut -d' ' -f1 > /cache/sums`
	e.run(ctx, e.buildPod("write", a, "away", class, write))
	e.waitPublished(ctx, "away", 1)

	// 1 MiB/s a connection: B's background fill (four at a time) takes
	// about 16 s, and the build that mounts first is done in a few.
	proxy.rate.Store(1 << 20)
	e.run(ctx, e.buildPod("mount", b, "away", class, "cat /cache/small.txt"))
	proxy.stop()
	out := e.run(ctx, e.buildPod("read", b, "away", class,
		"if cat /cache/data/64 > /dev/null 2>&1; then echo read; else echo read-failed; fi; echo built > /cache/out"))
	if strings.TrimSpace(out) != "read-failed" {
		t.Fatalf("a read of a file node %s had not fetched, with the registry away: %q, want it to fail", b, out)
	}
	e.waitEvent(ctx, "Cache", "away", "LazyFetchFailed", "on node "+b)
	e.waitEvent(ctx, "PersistentVolumeClaim", "read-cache", "Discarded", "fetched on demand, failed")

	proxy.rate.Store(0)
	proxy.start()
	e.waitFilled(ctx, "away", b)
	out = e.run(ctx, e.buildPod("check", b, "away", class,
		"cd /cache/data && md5sum * | md5sum | cut -d' ' -f1; cat /cache/sums; test ! -e /cache/out && echo no-out"))
	if got := strings.Fields(out); len(got) != 3 || got[0] != got[1] || got[2] != "no-out" {
		t.Errorf("node %s after the registry came back: %q, want A's checksums twice and no file of the discarded build", b, got)
	}
	if c, err := e.cache(ctx, "away"); err != nil || c.Status.Published.Generation != 1 {
		t.Errorf("Cache away: %v; want its chain at generation 1 (the discarded build published nothing)", err)
	}
}

// proxySecret is a copy of the registry's Secret whose credentials are
// for addr, the proxy's address; it is deleted with the test.
func (e *syncEnv) proxySecret(ctx context.Context, addr string) string {
	e.t.Helper()
	base, err := e.Client.CoreV1().Secrets(framework.SystemNamespace).Get(ctx, e.Reg.Secret, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	auth := base64.StdEncoding.EncodeToString([]byte(e.Reg.Username + ":" + e.Reg.Password))
	config, err := json.Marshal(map[string]any{"auths": map[string]any{addr: map[string]string{"auth": auth}}})
	if err != nil {
		e.t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: framework.SystemNamespace, Name: e.Namespace + "-proxy"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: config, "ca.crt": base.Data["ca.crt"]},
	}
	if _, err := e.Client.CoreV1().Secrets(framework.SystemNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		e.Client.CoreV1().Secrets(framework.SystemNamespace).Delete(context.Background(), secret.Name, metav1.DeleteOptions{})
	})
	return secret.Name
}

// tcpProxy forwards connections on a loopback port to target, the
// registry, whose TLS it passes through (its certificate names 127.0.0.1,
// whatever the port; the local backend's agents run on this host). It
// sends at most rate bytes per second a connection toward the client (0:
// no limit). stop closes the port and every connection, as an outage;
// start opens the same port again.
type tcpProxy struct {
	t      *testing.T
	target string
	addr   string
	rate   atomic.Int64

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	p := &tcpProxy{t: t, target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.stop)
	return p
}

func (p *tcpProxy) start() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("listen on the proxy's address again: %v", err)
	}
	p.serve(ln)
}

func (p *tcpProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for { // ends when stop closes the listener
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
}

func (p *tcpProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *tcpProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *tcpProxy) forward(client net.Conn) {
	defer client.Close()
	up, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(client) || !p.track(up) {
		return
	}
	go func() {
		io.Copy(up, client)
		up.Close()
	}()
	p.copySlowed(client, up)
}

// copySlowed copies src to dst, sleeping after each chunk for as long as
// rate allows it.
func (p *tcpProxy) copySlowed(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if rate := p.rate.Load(); rate > 0 {
				time.Sleep(time.Duration(int64(n) * int64(time.Second) / rate))
			}
		}
		if err != nil { // EOF, or the connection closed by stop
			return
		}
	}
}
