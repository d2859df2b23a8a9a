package lazyfs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
)

// sidecarEnv is a sidecar's lazyfs serving one image, mounted at target
// through an agent (Remote) that the test can end.
type sidecarEnv struct {
	cfg    SidecarConfig
	target string
	img    *countingImage
	big    []byte
	agent  *Remote
}

func newSidecarEnv(t *testing.T, wait time.Duration) *sidecarEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: FUSE, loop devices and mounts; run `make test` as root")
	}
	path, big := writeImage(t)
	f, err := os.Open(path)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	st, err := f.Stat()
	must(t, err)
	// Unix socket paths are short (108 bytes): not under t.TempDir().
	run, err := os.MkdirTemp("", "lazyfs-run-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(run) })
	cfg := SidecarConfig{
		Dir: t.TempDir(), Control: filepath.Join(run, "c.sock"), Images: filepath.Join(run, "i.sock"),
		Markers: t.TempDir(), Wait: wait,
	}
	sc, err := ServeSidecar(cfg, testr.New(t).WithName("sidecar"))
	must(t, err)
	e := &sidecarEnv{cfg: cfg, target: t.TempDir(), img: &countingImage{f: f, size: st.Size()}, big: big}
	t.Cleanup(func() {
		_ = unix.Unmount(e.target, unix.MNT_DETACH)
		if err := sc.Close(); err != nil {
			t.Error(err)
		}
	})
	e.agent = e.connect(t)
	must(t, e.agent.Add("layer-1", e.img))
	must(t, MountImage(e.agent.Path("layer-1"), e.target))
	if got, err := os.ReadFile(filepath.Join(e.target, "small.txt")); err != nil || string(got) != "hello\n" {
		t.Fatalf("small.txt = %q, %v", got, err)
	}
	return e
}

func (e *sidecarEnv) connect(t *testing.T) *Remote {
	t.Helper()
	r, err := ConnectSidecar(e.cfg, testr.New(t).WithName("agent"))
	must(t, err)
	t.Cleanup(func() { _ = r.Detach() })
	return r
}

// readBig reads big.bin, which no read has brought into the page cache.
func (e *sidecarEnv) readBig() <-chan error {
	done := make(chan error, 1)
	go func() {
		got, err := os.ReadFile(filepath.Join(e.target, "big.bin"))
		if err == nil && !bytes.Equal(got, e.big) {
			err = fmt.Errorf("big.bin: %d bytes, not the 8 MiB written", len(got))
		}
		done <- err
	}()
	return done
}

// TestSidecarOutlivesItsAgent: the agent that fetched a layer's bytes
// ends while the layer is mounted; a read then waits, and the next agent
// serves it once it has added the image again. Needs root.
func TestSidecarOutlivesItsAgent(t *testing.T) {
	e := newSidecarEnv(t, time.Minute)
	must(t, e.agent.Detach())

	done := e.readBig()
	select {
	case err := <-done:
		t.Fatalf("a read with no agent ended at once (%v); want it to wait for the next agent", err)
	case <-time.After(time.Second):
	}
	next := e.connect(t)
	if served, err := next.Serves("layer-1"); err != nil || !served {
		t.Fatalf("the sidecar serves layer-1 to the next agent: %v, %v; want true", served, err)
	}
	must(t, next.Add("layer-1", e.img))
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting read did not end within 30s of the next agent's start")
	}
	if _, err := os.Stat(e.cfg.marker("layer-1")); err == nil {
		t.Error("a failed-read marker was left though every read succeeded")
	}
}

// TestSidecarGivesUp: with no agent for longer than its wait, a read
// fails, and the sidecar leaves the marker by which the next agent
// discards the volumes over the layer. Needs root.
func TestSidecarGivesUp(t *testing.T) {
	e := newSidecarEnv(t, 500*time.Millisecond)
	must(t, e.agent.Detach())
	select {
	case err := <-e.readBig():
		if err == nil {
			t.Fatal("a read with no agent succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a read with no agent did not fail within 30s, past the sidecar's 500ms wait")
	}
	data, err := os.ReadFile(e.cfg.marker("layer-1"))
	must(t, err)
	var m Marker
	must(t, json.Unmarshal(data, &m))
	if !strings.Contains(m.Error, "no node agent served image layer-1") {
		t.Errorf("marker = %q, want why the read failed", m.Error)
	}
}

// TestSidecarRefusesBadNames: an image name is one file name of the
// lazyfs, never a path.
func TestSidecarRefusesBadNames(t *testing.T) {
	e := newSidecarEnv(t, time.Minute)
	for _, name := range []string{"", ".", "..", "../x", "a/b"} {
		if err := e.agent.Add(name, e.img); err == nil || !strings.Contains(err.Error(), "not a file name") {
			t.Errorf("Add(%q) = %v, want a refusal", name, err)
		}
	}
}
