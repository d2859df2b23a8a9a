package erofs

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkWrite writes 1 GiB in 50,000 files (100 dirs of 500) and
// compares with a plain sequential read of the same files, which is the
// floor for any writer: the "ratio" metric is write time / read time.
// Run with -benchtime 1x; building the tree takes longer than writing it.
func BenchmarkWrite(b *testing.B) {
	const files, total = 50000, 1 << 30
	dir := b.TempDir()
	rnd := rand.New(rand.NewPCG(1, 2))
	pool := make([]byte, 1<<20)
	for i := range pool {
		pool[i] = byte(rnd.Uint32())
	}
	var paths []string
	var size int64
	for i := range files {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i/500))
		if i%500 == 0 {
			if err := os.Mkdir(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		n := rnd.IntN(2 * total / files)
		off := rnd.IntN(len(pool) - n)
		p := filepath.Join(d, fmt.Sprintf("f%05d", i))
		if err := os.WriteFile(p, pool[off:off+n], 0o644); err != nil {
			b.Fatal(err)
		}
		paths = append(paths, p)
		size += int64(n)
	}
	read := func() time.Duration {
		start := time.Now()
		buf := make([]byte, 1<<20)
		for _, p := range paths {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			for {
				_, err := f.Read(buf)
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			f.Close()
		}
		return time.Since(start)
	}
	read() // same page-cache state for both
	readTime := read()

	b.SetBytes(size)
	b.ResetTimer()
	var st Stats
	var err error
	for b.Loop() {
		if st, err = Write(context.Background(), dir, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
	writeTime := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(float64(size)/readTime.Seconds()/1e6, "read-MB/s")
	b.ReportMetric(writeTime.Seconds()/readTime.Seconds(), "ratio")
	b.ReportMetric(float64(st.ImageBytes), "image-bytes")
	b.Logf("%d files, %d data bytes; read %v, write %v; image %d bytes", files, size, readTime, writeTime, st.ImageBytes)
}

// BenchmarkCheck checks an image of 50,000 small files in 100
// directories, as a pull does before it mounts the image: the time per
// inode is what the check adds to a pull, next to fetching the image.
func BenchmarkCheck(b *testing.B) {
	const files = 50000
	dir := b.TempDir()
	for i := range files {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i/500))
		if i%500 == 0 {
			if err := os.Mkdir(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), []byte("x"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	img, st := writeImage(b, dir)
	f, err := os.Open(img)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sb := Superblock{Blocks: uint32(st.ImageBytes / BlockSize), Inodes: uint64(st.Inodes)}
	b.SetBytes(st.ImageBytes)
	b.ResetTimer()
	for b.Loop() {
		if err := Check(f, sb); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(st.Inodes), "ns/inode")
}
