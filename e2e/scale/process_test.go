//go:build scale

package scale

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// process is a program the run started; it is stopped when the test ends.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// startProcess starts bin with args, its output in logDir/name.log, and
// stops it at the end of the test: SIGTERM, then SIGKILL after 15 s. A
// failed test shows the log's tail.
func startProcess(t *testing.T, logDir, name, bin string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("creating %s's log: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s (%s): %v", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("%s log (%s), last lines:\n%s", name, logPath, tail(logPath, 30))
		}
	})
	return p
}

// stop ends the process and its group (SIGTERM, then SIGKILL); it may be
// called more than once.
func (p *process) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Logf("%s did not stop within 15 s of SIGTERM: killing it", p.name)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// exited returns the process's end, or nil while it runs.
func (p *process) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited (log %s)", p.name, p.log)
		}
		return fmt.Errorf("%s exited: %w (log %s)", p.name, p.err, p.log)
	default:
		return nil
	}
}

// memory is a process's resident memory now and at its peak, from
// /proc/PID/status (VmRSS, VmHWM).
type memory struct {
	RSS, Peak int64 // bytes
}

func (p *process) memory() (memory, error) {
	if err := p.exited(); err != nil {
		return memory{}, err
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return memory{}, fmt.Errorf("reading %s's memory: %w", p.name, err)
	}
	defer f.Close()
	var m memory
	s := bufio.NewScanner(f)
	for s.Scan() {
		key, val, ok := strings.Cut(s.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("parsing %s's %s %q: %w", p.name, key, val, err)
		}
		if key == "VmRSS" {
			m.RSS = kb << 10
		} else {
			m.Peak = kb << 10
		}
	}
	if err := s.Err(); err != nil {
		return memory{}, fmt.Errorf("reading %s's memory: %w", p.name, err)
	}
	if m.RSS == 0 {
		return memory{}, fmt.Errorf("%s: no VmRSS in /proc/%d/status", p.name, p.cmd.Process.Pid)
	}
	return m, nil
}

// waitHTTP waits until url answers 200, or the process exits.
func (p *process) waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if err := p.exited(); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %s did not answer within %s (last: %v; log %s)", p.name, url, timeout, last, p.log)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// buildLayercache builds ./cmd/layercache of repo into dir, or returns
// prebuilt (SCALE_LAYERCACHE_BIN) when set.
func buildLayercache(t *testing.T, repo, dir, prebuilt string) string {
	t.Helper()
	if prebuilt != "" {
		if _, err := os.Stat(prebuilt); err != nil {
			t.Fatalf("SCALE_LAYERCACHE_BIN: %v", err)
		}
		return prebuilt
	}
	bin := filepath.Join(dir, "layercache")
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/layercache")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the layercache binary (go build ./cmd/layercache in %s): %v\n%s\n"+
			"The scale test runs the real manager and node agent of this tree; set SCALE_LAYERCACHE_BIN to a prebuilt binary to measure another one.", repo, err, out)
	}
	t.Logf("built %s in %s", bin, time.Since(start).Round(time.Second))
	return bin
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
