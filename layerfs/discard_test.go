package layerfs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Issue 8, item 5: Recover remounted volumes from a list read before it
// locked them, so a volume discarded in between came back (3 of 10 tries):
// writable, owned by no PV, never cleaned up. Recover re-reads each volume
// under its lock and leaves a discarded one alone. This test makes the
// interleaving happen every time: the list is read, then the volume is
// discarded, then Recover handles the stale entry.
func TestRecoverResurrectsDiscardedVolume(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	merged := mustMount(t, s, "v", "ns/c")
	must(t, unix.Unmount(merged, 0)) // a reboot: Recover will remount it
	recs, err := s.volumeRecords()
	must(t, err)
	must(t, s.Discard(ctx, "v"))
	var res RecoverResult
	if err := s.recoverVolume(ctx, recs[0], &res); err != nil {
		t.Errorf("recover a volume discarded meanwhile: %v, want it skipped", err)
	}
	if _, err := s.Volume(ctx, "v"); !errors.Is(err, ErrNotFound) || ondisk.IsMountPoint(merged) {
		t.Fatalf("a discarded volume was resurrected: %+v (err %v)", res, err)
	}
}

// TestRecoverDiscardConcurrently runs Recover and Discard at once with
// random timing (bounded: 30 tries).
func TestRecoverDiscardConcurrently(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	const tries = 30
	// Discard lands at a random instant within Recover's run.
	start := time.Now()
	_, err := s.Recover(ctx)
	must(t, err)
	window := max(2*time.Since(start), time.Millisecond)
	resurrected := 0
	for i := range tries {
		id := fmt.Sprintf("v%d", i)
		merged := mustMount(t, s, id, "ns/c")
		must(t, unix.Unmount(merged, 0)) // a reboot: Recover will remount it
		var wg sync.WaitGroup
		var recoverErr, discardErr error
		wg.Go(func() { _, recoverErr = s.Recover(ctx) })
		wg.Go(func() {
			time.Sleep(rand.N(window))
			discardErr = s.Discard(ctx, id)
		})
		wg.Wait()
		if recoverErr != nil {
			t.Fatalf("try %d: Recover: %v", i, recoverErr)
		}
		if discardErr != nil {
			t.Fatalf("try %d: Discard: %v", i, discardErr)
		}
		if _, err := s.Volume(ctx, id); !errors.Is(err, ErrNotFound) || ondisk.IsMountPoint(merged) {
			resurrected++
			s.Discard(ctx, id)
		}
	}
	if resurrected > 0 {
		t.Fatalf("%d of %d discarded volumes were resurrected by a concurrent Recover", resurrected, tries)
	}
}

// Anything that looks up a path on a mount (the kubelet's filesystem stats,
// a listing) holds it for a moment, and umount(2) then fails with EBUSY:
// a Discard or Commit failed as if a process still used the volume, seen
// as a flake of TestRecoverDiscardConcurrently while a local cluster ran
// on the machine. A hold that ends within the retries is waited out; one
// that lasts is still ErrBusy.
func TestUnmountBusyForAMoment(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{})
	tests := []struct {
		name     string
		hold     time.Duration
		wantBusy bool
	}{
		{"held for a moment", 30 * time.Millisecond, false},
		{"held until the end", time.Hour, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf("v%d", i)
			f, err := os.Open(mustMount(t, s, id, "ns/c"))
			must(t, err)
			released := time.AfterFunc(tt.hold, func() { f.Close() })
			err = s.Discard(ctx, id)
			if released.Stop() {
				f.Close()
			}
			if gotBusy := errors.Is(err, ErrBusy); gotBusy != tt.wantBusy || (err != nil && !tt.wantBusy) {
				t.Fatalf("Discard: %v, want busy=%v", err, tt.wantBusy)
			}
			if tt.wantBusy {
				must(t, s.Discard(ctx, id))
			}
		})
	}
}
