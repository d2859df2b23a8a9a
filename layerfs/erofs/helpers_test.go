package erofs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/erofs/erofstest"
)

// requireTools fails (never skips) a test that cannot run here: these
// tests mount images and make devices, and check every image with an
// independent reader.
func requireTools(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (it mounts EROFS images and creates device nodes); run it as root")
	}
	if _, err := exec.LookPath("fsck.erofs"); err != nil {
		t.Fatal("fsck.erofs not found; install it with: apt-get install erofs-utils")
	}
}

// writeImage writes dir as an image in a temp file, checks it with
// fsck.erofs and returns its path.
func writeImage(t testing.TB, dir string) (string, Stats) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "layer.erofs")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Write(context.Background(), dir, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("Write(%s): %v", dir, err)
	}
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != st.ImageBytes {
		t.Fatalf("image is %d bytes, Stats.ImageBytes says %d", fi.Size(), st.ImageBytes)
	}
	fsck(t, img)
	if err := checkImage(t, img); err != nil {
		t.Fatalf("Check of the writer's image of %s: %v", dir, err)
	}
	return img, st
}

func fsck(t testing.TB, img string) {
	t.Helper()
	// fsck.erofs recurses per directory level with ~12 KiB of stack each;
	// the 2,100-deep tree needs more than the default 8 MiB.
	out, err := exec.Command("sh", "-c", `ulimit -s unlimited && exec fsck.erofs "$1"`, "sh", img).CombinedOutput()
	if err != nil {
		t.Fatalf("fsck.erofs %s: %v\n%s", img, err, out)
	}
}

// mountImage mounts img read-only, file-backed, and unmounts it at cleanup.
func mountImage(t testing.TB, img string) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(img, mnt, "erofs", unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("mount -t erofs -o ro %s %s: %v (needs a kernel with file-backed EROFS, 6.12+)", img, mnt, err)
	}
	t.Cleanup(func() { unmount(t, mnt) })
	return mnt
}

func unmount(t testing.TB, mnt string) {
	if err := unix.Unmount(mnt, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	}
}

// Tree building, by fd so depth is unbounded: erofstest's, which the
// random trees use too.
var (
	mkfile   = erofstest.Mkfile
	must     = erofstest.Must
	setxattr = erofstest.Setxattr
)

func sha(t testing.TB, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
