package receive

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

func TestCopyPipelined(t *testing.T) {
	data := make([]byte, 5<<20+123)
	rand.NewChaCha8([32]byte{7}).Read(data)
	readFailure, writeFailure := errors.New("registry went away"), errors.New("disk full")
	tests := []struct {
		name    string
		src     io.Reader
		dst     io.Writer
		wantErr error
		wantN   int64
	}{
		{"whole", bytes.NewReader(data), &bytes.Buffer{}, nil, int64(len(data))},
		{"one byte at a time", iotest.OneByteReader(bytes.NewReader(data[:10000])), &bytes.Buffer{}, nil, 10000},
		{"empty", bytes.NewReader(nil), &bytes.Buffer{}, nil, 0},
		{"read error", io.MultiReader(bytes.NewReader(data[:3<<20]), iotest.ErrReader(readFailure)), &bytes.Buffer{}, readFailure, 3 << 20},
		{"write error", bytes.NewReader(data), &failingWriter{left: 2 << 20, err: writeFailure}, writeFailure, 2 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := CopyPipelined(tt.dst, tt.src, 1<<20, 2)
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if n != tt.wantN {
				t.Errorf("copied %d bytes, want %d", n, tt.wantN)
			}
			if buf, ok := tt.dst.(*bytes.Buffer); ok && !bytes.Equal(buf.Bytes(), data[:n]) {
				t.Errorf("the copy differs from the source")
			}
		})
	}
}

// failingWriter takes left bytes, then fails.
type failingWriter struct {
	left int
	err  error
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) > w.left {
		n := w.left
		w.left = 0
		return n, w.err
	}
	w.left -= len(p)
	return len(p), nil
}
