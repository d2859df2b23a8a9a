package lazyfs

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/erofs"
	"github.com/layercache/layercache/layerfs/lazy"
)

// countingImage is an image file whose reads are counted, as the
// registry's range requests would be.
type countingImage struct {
	f    *os.File
	size int64
	read atomic.Int64
}

func (c *countingImage) Size() int64 { return c.size }

func (c *countingImage) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	n, err := c.f.ReadAt(p, off)
	c.read.Add(int64(n))
	return n, err
}

// writeImage writes an EROFS image of a tree with a small file and a
// large one (8 MiB of random bytes) and returns the image's path and the
// large file's bytes.
func writeImage(t *testing.T) (string, []byte) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	must(t, os.MkdirAll(src, 0o755))
	must(t, os.WriteFile(filepath.Join(src, "small.txt"), []byte("hello\n"), 0o644))
	big := make([]byte, 8<<20)
	_, _ = rand.Read(big)
	must(t, os.WriteFile(filepath.Join(src, "big.bin"), big, 0o644))
	img := filepath.Join(t.TempDir(), "layer.erofs")
	f, err := os.Create(img)
	must(t, err)
	defer f.Close()
	if _, err := erofs.Write(context.Background(), src, f); err != nil {
		t.Fatal(err)
	}
	return img, big
}

// TestMountReadSettle: a layer image served here mounts at once; reading
// one small file reads a fraction of the image through the server; once
// settled on the local copy, the whole layer reads right and nothing
// more is read from the image it was served from. Needs root (FUSE and
// mounts).
func TestMountReadSettle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: FUSE and mounts; run `make test` as root")
	}
	path, big := writeImage(t)
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	st, err := f.Stat()
	must(t, err)
	img := &countingImage{f: f, size: st.Size()}

	dir, target := t.TempDir(), t.TempDir()
	s, err := Serve(dir, testr.New(t))
	must(t, err)
	t.Cleanup(func() {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	must(t, s.Add("layer-1", img))
	if err := s.Add("layer-1", img); err == nil {
		t.Error("added image layer-1 twice")
	}
	must(t, MountImage(s.Path("layer-1"), target))

	got, err := os.ReadFile(filepath.Join(target, "small.txt"))
	if err != nil || string(got) != "hello\n" {
		t.Fatalf("small.txt = %q, %v", got, err)
	}
	if read := img.read.Load(); read >= img.size/2 {
		t.Errorf("reading one small file read %d of the image's %d bytes through the server; want a fraction", read, img.size)
	}

	for _, bad := range []struct{ name, path string }{
		{"layer-2", path},                     // not served
		{"layer-1", "relative/image"},         // not an absolute path
		{"layer-1", filepath.Dir(path)},       // not a regular file
		{"layer-1", filepath.Join(dir, "..")}, // not clean
	} {
		if err := s.Settle(bad.name, bad.path); err == nil {
			t.Errorf("Settle(%q, %q) succeeded; want an error", bad.name, bad.path)
		}
	}
	must(t, s.Settle("layer-1", path))
	before := img.read.Load()
	got, err = os.ReadFile(filepath.Join(target, "big.bin"))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big.bin after the settle: %d bytes, %v; want the 8 MiB written", len(got), err)
	}
	if after := img.read.Load(); after != before {
		t.Errorf("after the settle %d more bytes were read from the image it replaced; want none", after-before)
	}
	must(t, s.Settle("layer-1", path)) // a settle retried after a crash
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestLazyLayer: the whole path of a layer mounted before its bytes are
// here, its image read by range (layerfs/lazy tests the fetches over
// HTTP): the mount and a small file's read fetch a fraction of the
// image, Fill completes the local copy, and the settled mount reads the
// layer from it with no more fetches. Needs root.
func TestLazyLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: FUSE and mounts; run `make test` as root")
	}
	path, big := writeImage(t)
	image, err := os.ReadFile(path)
	must(t, err)
	// The registry's range requests, counted.
	var served atomic.Int64
	fetch := func(_ context.Context, off, n int64) (io.ReadCloser, error) {
		served.Add(n)
		return io.NopCloser(bytes.NewReader(image[off : off+n])), nil
	}
	local := filepath.Join(t.TempDir(), "copy.erofs")
	f, err := lazy.Open(lazy.Options{Path: local, Size: int64(len(image)), Fetch: fetch, Wait: 10 * time.Second})
	must(t, err)
	defer f.Close()

	dir, target := t.TempDir(), t.TempDir()
	s, err := Serve(dir, testr.New(t))
	must(t, err)
	t.Cleanup(func() {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		must(t, s.Close())
	})
	must(t, s.Add("layer-1", f))
	must(t, MountImage(s.Path("layer-1"), target))
	if got, err := os.ReadFile(filepath.Join(target, "small.txt")); err != nil || string(got) != "hello\n" {
		t.Fatalf("small.txt = %q, %v", got, err)
	}
	n := served.Load()
	if n >= int64(len(image))/2 {
		t.Errorf("the mount and one small file fetched %d of the image's %d bytes; want a fraction", n, len(image))
	}
	t.Logf("the mount and one small file fetched %d of the image's %d bytes (%d chunks on demand)", n, len(image), f.Stats().LocalChunks)

	must(t, f.Fill(context.Background()))
	must(t, s.Settle("layer-1", local))
	must(t, f.Close()) // the file reads the local image alone now
	before := served.Load()
	if got, err := os.ReadFile(filepath.Join(target, "big.bin")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big.bin from the settled copy: %d bytes, %v; want the 8 MiB written", len(got), err)
	}
	if n := served.Load(); n != before {
		t.Errorf("%d bytes fetched after the copy was complete and settled; want none", n-before)
	}
}
