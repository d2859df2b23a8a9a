package flock

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Lock is an flock on a lock file. flock works across processes, so the
// CLI and the node agent can share a store.
type Lock struct {
	f    *os.File
	path string
	gate chan struct{} // held with the flock, if it was taken through a gate
}

// Gates queues a process's own waiters for an exclusive lock in
// memory, ahead of the flock: flockContext polls with a backoff of up to
// 100 ms, which, with many waiters (the commits of one cache when many
// builds end at once), leaves the lock idle between holders; a gate hands
// it on at once. Other processes still meet at the flock.
type Gates struct{ m sync.Map } // path -> chan struct{} of capacity 1

// Acquire takes path's gate, then its exclusive flock.
func (g *Gates) Acquire(ctx context.Context, path string) (*Lock, error) {
	v, _ := g.m.LoadOrStore(path, make(chan struct{}, 1))
	gate := v.(chan struct{})
	select {
	case gate <- struct{}{}: // free: taken even with ctx done, as flockContext does
	default:
		select {
		case gate <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("lock %s: waiting for lock: %w", path, ctx.Err())
		}
	}
	l, err := Acquire(ctx, path, false)
	if err != nil {
		<-gate
		return nil, err
	}
	l.gate = gate
	return l, nil
}

// maxLockAttempts bounds the retries when a lock file is replaced under us.
const maxLockAttempts = 100

// Acquire takes an exclusive (or shared) flock on path, creating the file.
// Lock files of removed objects are unlinked by their last holder, so after
// taking the lock we check that path still names the locked inode; if not,
// the object was removed meanwhile and we try again on the new file.
func Acquire(ctx context.Context, path string, shared bool) (*Lock, error) {
	how := unix.LOCK_EX
	if shared {
		how = unix.LOCK_SH
	}
	for range maxLockAttempts {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", path, err)
		}
		if err := flockContext(ctx, f, how); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if sameFile(f, path) {
			return &Lock{f: f, path: path}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("lock %s: the lock file kept being replaced", path)
}

// flockContext polls a non-blocking flock so that a waiting caller can be
// cancelled; a blocking flock cannot be interrupted by a context.
func flockContext(ctx context.Context, f *os.File, how int) error {
	delay := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for lock: %w", ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

func sameFile(f *os.File, path string) bool {
	var held, named unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &named) != nil {
		return false
	}
	return held.Dev == named.Dev && held.Ino == named.Ino
}

// Unlock releases the lock.
func (l *Lock) Unlock() {
	l.f.Close()
	l.openGate()
}

func (l *Lock) openGate() {
	if l.gate != nil {
		<-l.gate
	}
}

// RemoveAndUnlock unlinks the lock file of a removed object, then releases
// it; waiters notice the unlinked inode and retry on a fresh file.
func (l *Lock) RemoveAndUnlock() {
	os.Remove(l.path)
	l.f.Close()
	l.openGate()
}
