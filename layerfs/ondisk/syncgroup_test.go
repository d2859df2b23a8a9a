package ondisk

import (
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every caller returns only after a syncfs that started after it called,
// and concurrent callers share rounds.
func TestSyncGroupCoversEachCallerAndCoalesces(t *testing.T) {
	var started atomic.Int64 // rounds started so far
	var rounds atomic.Int64
	g := &SyncGroup{syncfs: func(string) error {
		started.Add(1)
		time.Sleep(20 * time.Millisecond)
		rounds.Add(1)
		return nil
	}}
	dir := t.TempDir()
	const callers = 40
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			before := started.Load() // rounds begun before the call
			if err := g.Sync(dir); err != nil {
				t.Error(err)
			}
			if done := rounds.Load(); done <= before {
				t.Errorf("sync returned after %d rounds; %d had begun before it was called", done, before)
			}
		})
	}
	wg.Wait()
	if n := rounds.Load(); n > callers/4 {
		t.Errorf("%d concurrent callers cost %d syncfs rounds; want them shared", callers, n)
	}
}

// A round's error reaches every caller of that round.
func TestSyncGroupReportsErrors(t *testing.T) {
	boom := errors.New("EIO")
	g := &SyncGroup{syncfs: func(string) error { return boom }}
	if err := g.Sync(t.TempDir()); !errors.Is(err, boom) {
		t.Fatalf("sync = %v, want %v", err, boom)
	}
	if err := g.Sync(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("sync of a missing path succeeded")
	}
}
