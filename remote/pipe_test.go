package remote

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

func TestPipeWriter(t *testing.T) {
	data := make([]byte, 4<<20+17)
	rand.NewChaCha8([32]byte{3}).Read(data)
	diskFull := errors.New("disk full")
	tests := []struct {
		name    string
		writes  []int // sizes of the writes, in turn
		failAt  int   // the sink fails once it has this many bytes (0: never)
		wantErr error
	}{
		{"one write", []int{len(data)}, 0, nil},
		{"small and odd writes", []int{1, 4095, 1 << 20, 7, 2 << 20}, 0, nil},
		{"nothing", nil, 0, nil},
		{"the sink fails", []int{len(data)}, 1 << 20, diskFull},
		{"the sink fails, writes go on", []int{1 << 20, 1 << 20, 1 << 20, 1 << 20}, 1 << 20, diskFull},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := &limitedSink{limit: tt.failAt, err: diskFull}
			pw := newPipeWriter(sink, 1<<20, 2)
			var want []byte
			off := 0
			for _, n := range tt.writes {
				if _, err := pw.Write(data[off : off+n]); err != nil && tt.wantErr == nil {
					t.Fatalf("write: %v", err)
				}
				want = append(want, data[off:off+n]...)
				off += n
			}
			err := pw.Close()
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("close: %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr == nil && !bytes.Equal(sink.buf.Bytes(), want) {
				t.Errorf("the sink got %d bytes that differ from the %d written", sink.buf.Len(), len(want))
			}
		})
	}
}

// limitedSink takes limit bytes (0: any number), then fails with err.
type limitedSink struct {
	buf   bytes.Buffer
	limit int
	err   error
}

func (s *limitedSink) Write(p []byte) (int, error) {
	if s.limit > 0 && s.buf.Len()+len(p) > s.limit {
		return 0, s.err
	}
	return s.buf.Write(p)
}
