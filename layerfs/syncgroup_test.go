package layerfs

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// A waiter for a cache's lock in this process can give up while another
// holds it, and takes it at once when it is released.
func TestCacheLockGate(t *testing.T) {
	s := newTestStore(t, Options{})
	c := mustRef(t, "ns/c")
	held, err := s.lockCache(context.Background(), c)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.lockCache(ctx, c); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lockCache while held = %v, want the context's deadline", err)
	}
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	held.Unlock()
	for range 20 { // a free lock is taken even with a context done
		l, err := s.lockCache(done, c)
		must(t, err)
		l.Unlock()
	}
	held, err = s.lockCache(context.Background(), c)
	must(t, err)
	got := make(chan time.Time)
	go func() {
		l, err := s.lockCache(context.Background(), c)
		must(t, err)
		got <- time.Now()
		l.Unlock()
	}()
	time.Sleep(300 * time.Millisecond) // the flock's poll backs off to 100 ms by now
	released := time.Now()
	held.Unlock()
	if wait := (<-got).Sub(released); wait > 20*time.Millisecond {
		t.Errorf("the waiter took the lock %v after its release", wait)
	}
}

// Issue 18: a commit held its cache's lock while it synced the filesystem,
// so the commits of one cache queued behind each other's syncfs. The seal
// happens under the volume's lock alone.
func TestCommitSealsOutsideCacheLock(t *testing.T) {
	s := newTestStore(t, Options{})
	merged := mustMount(t, s, "v", "ns/c")
	writeFile(t, filepath.Join(merged, "f"), "x")
	held, err := s.lockCache(context.Background(), mustRef(t, "ns/c"))
	must(t, err)
	done := make(chan error)
	go func() { _, err := s.Commit(context.Background(), "v"); done <- err }()
	for deadline := time.Now().Add(10 * time.Second); ondisk.IsMountPoint(merged); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the commit did not unmount its volume while another held the cache's lock")
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the commit returned (%v) while another held the cache's lock", err)
	case <-time.After(50 * time.Millisecond):
	}
	held.Unlock()
	must(t, <-done)
	if got := readFile(t, filepath.Join(mustMount(t, s, "view", "ns/c"), "f")); got != "x" {
		t.Fatalf("committed file reads %q", got)
	}
}

// A commit that gives up waiting for its cache's lock, after it sealed
// its volume, leaves the volume mounted with its changes for a retry.
func TestCommitCancelledAfterSealRemounts(t *testing.T) {
	s := newTestStore(t, Options{})
	merged := mustMount(t, s, "v", "ns/c")
	writeFile(t, filepath.Join(merged, "f"), "x")
	held, err := s.lockCache(context.Background(), mustRef(t, "ns/c"))
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Commit(ctx, "v"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Commit = %v, want the context's deadline", err)
	}
	held.Unlock()
	if !ondisk.IsMountPoint(merged) {
		t.Fatal("the volume is not mounted after the commit gave up")
	}
	if got := readFile(t, filepath.Join(merged, "f")); got != "x" {
		t.Fatalf("the volume's file reads %q after the commit gave up", got)
	}
	mustCommit(t, s, "v")
	if got := readFile(t, filepath.Join(mustMount(t, s, "view", "ns/c"), "f")); got != "x" {
		t.Fatalf("committed file reads %q", got)
	}
}
