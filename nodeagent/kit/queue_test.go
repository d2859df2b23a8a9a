package kit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestKeyQueueTimesFromFirstAdd: a worker sees the time its key was first
// queued: a second Add while it waits does not move it, a failed attempt's
// retry keeps it, and once done the key's next Add starts a new wait.
func TestKeyQueueTimesFromFirstAdd(t *testing.T) {
	q := NewKeyQueue("test")
	before := time.Now()
	q.Add("ns/a")
	after := time.Now()
	time.Sleep(5 * time.Millisecond)
	q.Add("ns/a") // waits already: same time

	var mu sync.Mutex
	var seen []time.Time
	attempts := 0
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		WorkKeys(ctx, q, 1, "test", "key", func(ctx context.Context, key string) error {
			mu.Lock()
			defer mu.Unlock()
			at, ok := QueuedAt(ctx)
			if !ok {
				t.Errorf("attempt %d of %s: no queued time in the context", attempts+1, key)
			}
			seen = append(seen, at)
			attempts++
			if attempts == 1 {
				return errors.New("fails once")
			}
			if attempts == 2 {
				q.Add(key) // queued again while a worker has it
			}
			return nil
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done

	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("worker ran %d times, want 3 (a failure, its retry, the Add during the retry)", len(seen))
	}
	if seen[0].Before(before) || seen[0].After(after) || !seen[1].Equal(seen[0]) {
		t.Errorf("first attempt and retry saw %v and %v, want the first Add's time, in [%v, %v]", seen[0], seen[1], before, after)
	}
	if !seen[2].After(after) {
		t.Errorf("the Add during the retry saw %v, want a time after the first Add (%v)", seen[2], after)
	}
}
