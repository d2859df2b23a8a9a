package remote

import (
	"errors"
	"io"
	"sync/atomic"
)

// pipeWriter hands what is written to it, in buffers of bufSize, to a
// goroutine that writes them to w: a push hashes and compresses the
// last megabytes while the exporter reads the next files.
type pipeWriter struct {
	buf  []byte
	full chan []byte
	free chan []byte
	done chan error
	// failed tells Write to stop early: the error itself is Close's.
	failed atomic.Bool
}

var errSinkFailed = errors.New("the compressor failed (see the push's error)")

func newPipeWriter(w io.Writer, bufSize, depth int) *pipeWriter {
	p := &pipeWriter{full: make(chan []byte, depth), free: make(chan []byte, depth+1), done: make(chan error, 1)}
	for range depth + 1 {
		p.free <- make([]byte, 0, bufSize)
	}
	p.buf = <-p.free
	go func() {
		var err error
		for buf := range p.full {
			if err == nil {
				if _, err = w.Write(buf); err != nil {
					p.failed.Store(true)
				}
			}
			p.free <- buf[:0]
		}
		p.done <- err
	}()
	return p
}

func (p *pipeWriter) Write(b []byte) (int, error) {
	if p.failed.Load() {
		return 0, errSinkFailed
	}
	n := len(b)
	for len(b) > 0 {
		take := min(cap(p.buf)-len(p.buf), len(b))
		p.buf = append(p.buf, b[:take]...)
		b = b[take:]
		if len(p.buf) == cap(p.buf) {
			p.full <- p.buf
			p.buf = <-p.free
		}
	}
	return n, nil
}

// Close writes what is buffered and waits for the goroutine: its error
// is the first the writes met.
func (p *pipeWriter) Close() error {
	if len(p.buf) > 0 {
		p.full <- p.buf
	}
	close(p.full)
	return <-p.done
}
