package lazy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// A copy that fails the image's digest fails Fill and is never complete.
func TestDigestMismatch(t *testing.T) {
	img := testImage(16*testChunk, 8)
	o := options(t, newRegistry(t, img, nil), testChunk)
	o.Digest = digest.FromString("another image")
	f := open(t, o)
	if err := f.Fill(context.Background()); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Fill: %v, want ErrCorrupt", err)
	}
	if f.Complete() {
		t.Fatal("a copy that fails the digest counts as complete")
	}
	must(t, f.Close())
	if f := open(t, o); f.Complete() {
		t.Fatal("the reopened copy that failed the digest counts as complete")
	}
}

// A reopened copy keeps the chunks its state file records and fetches the
// rest; a state file that is not this image's is not trusted.
func TestReopen(t *testing.T) {
	img := testImage(20*testChunk+5, 9)
	tests := []struct {
		name   string
		change func(o *Options, statePath string) // between the runs
		keeps  bool
	}{
		{"same image", func(*Options, string) {}, true},
		{"another chunk size", func(o *Options, _ string) { o.ChunkSize *= 2 }, false},
		{"another size", func(o *Options, _ string) { o.Size-- }, false},
		{"bits past the chunk count", editState(func(s *state) { s.Have[len(s.Have)-1] |= 0x80 }), false},
		{"another chunk count", editState(func(s *state) { s.Chunks++ }), false},
		{"bitmap of another length", editState(func(s *state) { s.Have = append(s.Have, 0) }), false},
		{"another version", editState(func(s *state) { s.Version++ }), false},
		{"garbage", func(_ *Options, p string) { os.WriteFile(p, []byte("{"), 0o600) }, false},
		{"copy replaced", func(o *Options, _ string) { os.Truncate(o.Path, 10) }, false},
		// What a crash leaves of chunks it did not record (other bytes
		// where the image has zeros too, chunk 6) is fetched again.
		{"unrecorded chunks hold other bytes", func(o *Options, _ string) {
			f, _ := os.OpenFile(o.Path, os.O_WRONLY, 0)
			defer f.Close()
			for _, c := range []int64{0, 6, 19} {
				f.WriteAt(bytes.Repeat([]byte{0xaa}, testChunk), c*testChunk)
			}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, img, nil)
			o := options(t, reg, testChunk)
			f := open(t, o)
			for _, c := range []int64{1, 7, 20} {
				readAt(t, f, c*testChunk, 1)
			}
			must(t, f.Close())
			tt.change(&o, statePath(o.Path))
			before := reg.requests.Load()
			f = open(t, o)
			readAt(t, f, 7*testChunk, 1)
			again := reg.requests.Load() - before
			if tt.keeps != (again == 0) {
				t.Fatalf("a read of a recorded chunk after reopening made %d requests; want the record kept: %v", again, tt.keeps)
			}
			must(t, f.Fill(context.Background()))
			if tt.keeps {
				if n := reg.requests.Load() - before; n != 18 {
					t.Errorf("Fill after reopening made %d requests, want 18 (21 chunks, 3 recorded)", n)
				}
			}
			assertCopy(t, o.Path, img[:o.Size])
		})
	}
}

func editState(edit func(*state)) func(*Options, string) {
	return func(_ *Options, path string) {
		var s state
		data, _ := os.ReadFile(path)
		if json.Unmarshal(data, &s) != nil {
			panic("state file unreadable")
		}
		edit(&s)
		data, _ = json.Marshal(s)
		os.WriteFile(path, data, 0o600)
	}
}

// Close stops a Fill that waits on a stalled registry, records what was
// fetched, and fails later calls.
func TestCloseStopsFill(t *testing.T) {
	img := testImage(16*testChunk, 10)
	reg := newRegistry(t, img, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		return n > 3 && stall(n, w, r)
	})
	o := options(t, reg, testChunk)
	o.Wait, o.Parallel = time.Hour, 1
	o.Digest = digest.FromBytes(img) // its check, beside the fetches, stops too
	f, err := Open(o)
	must(t, err)
	filled := make(chan error)
	go func() { filled <- f.Fill(context.Background()) }()
	for reg.requests.Load() < 4 {
		time.Sleep(time.Millisecond)
	}
	must(t, f.Close())
	if err := <-filled; err == nil {
		t.Fatal("Fill stopped by Close returned nil")
	}
	if _, err := f.ReadAt(context.Background(), make([]byte, 1), 0); err == nil {
		t.Error("a read after Close succeeded")
	}
	f = open(t, Options{Path: o.Path, Size: o.Size, ChunkSize: o.ChunkSize, Digest: o.Digest, Fetch: newRegistry(t, img, nil).fetch})
	if n := f.Stats().LocalChunks; n != 3 {
		t.Errorf("reopened after Close: %d chunks recorded, want the 3 fetched", n)
	}
}
