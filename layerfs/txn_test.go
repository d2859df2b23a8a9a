package layerfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A transaction writes what its closure changed, and nothing else: not
// on a failure, not an unchanged record, not a lock file of a name that
// does not exist.
func TestTransactWritesOnlyWhatChanged(t *testing.T) {
	ctx := context.Background()
	ref := CacheRef{"ns", "c"}
	tests := []struct {
		name        string
		sc          scope
		fn          func(t *txn) error
		wantErr     bool
		wantGen     int64 // the head's generation on disk afterwards
		wantNoLocks []string
	}{
		{"unchanged", scope{cache: ref}, func(*txn) error { return nil }, false, 1, nil},
		{"changed", scope{cache: ref}, func(t *txn) error { t.Head.Generation = 7; return nil }, false, 7, nil},
		{"failed", scope{cache: ref}, func(t *txn) error { t.Head.Generation = 7; return errors.New("no") }, true, 1, nil},
		{"unknown volume", scope{volume: "nope"}, func(t *txn) error {
			if t.Volume != nil || t.Head != nil {
				return errors.New("read something of nothing")
			}
			return nil
		}, false, 1, []string{"volume-nope"}},
		{"unknown cache", scope{cache: CacheRef{"ns", "nope"}}, func(*txn) error { return nil }, false, 1, []string{"cache-ns_nope"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestStore(t, Options{})
			writeFile(t, filepath.Join(mustMount(t, s, "v", "ns/c"), "f"), "x")
			mustCommit(t, s, "v")
			before, err := os.Stat(s.headPath(ref))
			must(t, err)
			err = s.transact(ctx, tt.sc, tt.fn)
			if (err != nil) != tt.wantErr {
				t.Fatalf("transact: %v, want error %v", err, tt.wantErr)
			}
			h, err := s.readHead(ref)
			must(t, err)
			if h.Generation != tt.wantGen {
				t.Errorf("generation on disk %d, want %d", h.Generation, tt.wantGen)
			}
			after, err := os.Stat(s.headPath(ref))
			must(t, err)
			if rewritten := !os.SameFile(before, after); rewritten != (tt.wantGen != 1) {
				t.Errorf("head rewritten %v, want %v", rewritten, tt.wantGen != 1)
			}
			for _, l := range tt.wantNoLocks {
				assertMissing(t, filepath.Join(s.locksDir(), l))
			}
		})
	}
}
