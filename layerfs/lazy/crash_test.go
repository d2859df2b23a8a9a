package lazy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// The crash test runs Fill in a child process (this test binary,
// re-executed) that kills itself with SIGKILL at its Nth fault point (a
// chunk written, a state file's write or rename), for N = 1, 2, ... until
// Fill completes without reaching N, as layerfs's crash tests do. After
// each crash every chunk the state file records must hold the image's
// bytes, and a reopened copy must fetch only the others and end equal to
// the image.

const (
	envCrashDir = "LAZY_CRASH_DIR"
	envCrashAt  = "LAZY_CRASH_AT"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envCrashDir); dir != "" {
		os.Exit(crashChild(dir))
	}
	os.Exit(m.Run())
}

// The crashed image: 24 chunks of 128 KiB, zeros over its second quarter
// (holes), recorded every 4 chunks, fetched 2 at a time.
const crashChunk = 128 << 10

func crashImage() []byte { return testImage(24*crashChunk-1000, 11) }

func crashOptions(dir string, reg *registry) Options {
	return Options{
		Path: filepath.Join(dir, "image"), Size: int64(len(reg.img)), ChunkSize: crashChunk,
		Fetch: reg.fetch, ChunkDigests: chunkDigests(reg.img, crashChunk), Parallel: 2,
		syncEvery: 4 * crashChunk,
	}
}

func crashChild(dir string) int {
	at, _ := strconv.ParseInt(os.Getenv(envCrashAt), 10, 64)
	var steps atomic.Int64 // Fill's fetches reach fault points at once
	ondisk.FaultPoint = func() {
		if steps.Add(1) == at {
			unix.Kill(os.Getpid(), unix.SIGKILL)
		}
	}
	reg := startRegistry(crashImage(), nil)
	f, err := Open(crashOptions(dir, reg))
	if err == nil {
		err = f.Fill(context.Background())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 3
	}
	return 0
}

// runCrashChild reports whether the child was killed before it finished.
func runCrashChild(t *testing.T, dir string, at int) bool {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashDir+"="+dir, envCrashAt+"="+strconv.Itoa(at))
	out, err := cmd.CombinedOutput()
	if err == nil {
		return false
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		return true
	}
	t.Fatalf("crash child (killed at step %d) failed: %v\n%s", at, err, out)
	return false
}

func TestCrashDuringFill(t *testing.T) {
	img := crashImage()
	crashes := 0
	for at := 1; at < 1000; at++ {
		dir := t.TempDir()
		killed := runCrashChild(t, dir, at)
		reg := newRegistry(t, img, nil)
		o := crashOptions(dir, reg)
		recorded := checkRecorded(t, o, img)
		f := open(t, o)
		must(t, f.Fill(context.Background()))
		must(t, f.Close())
		assertCopy(t, o.Path, img)
		if n, want := reg.requests.Load(), int64(24-recorded); n != want {
			t.Fatalf("crash at step %d: Fill after it made %d requests, want %d (24 chunks, %d recorded)", at, n, want, recorded)
		}
		if !killed {
			break
		}
		crashes++
	}
	if crashes < 10 {
		t.Fatalf("only %d crash points exercised", crashes)
	}
	t.Logf("recovered from a crash at each of %d steps", crashes)
}

// checkRecorded fails unless every chunk the crashed copy's state file
// records holds the image's bytes; it returns how many it records.
func checkRecorded(t *testing.T, o Options, img []byte) int {
	t.Helper()
	o, err := o.normalized()
	must(t, err)
	have, _, _ := loadState(o)
	if have == nil {
		return 0
	}
	copied, err := os.ReadFile(o.Path)
	must(t, err)
	for c := range have.n {
		from, to := int64(c)*crashChunk, min(int64(c+1)*crashChunk, int64(len(img)))
		if have.has(c) && !bytes.Equal(copied[from:to], img[from:to]) {
			t.Fatalf("chunk %d is recorded but the copy holds other bytes", c)
		}
	}
	return have.count
}
