package receive

import (
	"errors"
	"io"
)

// CopyPipelined copies src to dst with reading and writing in turns on
// two goroutines, so a pull decompresses the next buffers while the last
// ones go to disk: on two cores that is the difference between the sum of
// the two and the larger of them. It returns when both sides have
// stopped, so src is not read after it returns.
func CopyPipelined(dst io.Writer, src io.Reader, bufSize, depth int) (int64, error) {
	full := make(chan []byte, depth)
	free := make(chan []byte, depth+1)
	for range depth + 1 {
		free <- make([]byte, bufSize)
	}
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		defer close(full)
		for {
			var buf []byte
			select {
			case buf = <-free:
			case <-stop:
				readErr <- nil
				return
			}
			n, err := io.ReadFull(src, buf)
			if n > 0 {
				select {
				case full <- buf[:n]:
				case <-stop:
					readErr <- nil
					return
				}
			}
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				readErr <- nil
				return
			}
			if err != nil {
				readErr <- err
				return
			}
		}
	}()
	var written int64
	var writeErr error
	for buf := range full {
		if writeErr == nil {
			var n int
			n, writeErr = dst.Write(buf)
			written += int64(n)
			if writeErr != nil {
				close(stop)
			}
		}
		free <- buf[:cap(buf)]
	}
	return written, errors.Join(writeErr, <-readErr)
}
