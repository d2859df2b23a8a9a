package loop

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestEnsureBlockNode: a missing loop device node is made with the right
// numbers, an existing one is kept, and anything else at the path is
// refused rather than used. Needs root (mknod).
func TestEnsureBlockNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: mknod makes device nodes; run `make test` as root")
	}
	dir := t.TempDir()
	node := filepath.Join(dir, "loop42")
	for range 2 { // made, then found
		if err := ensureBlockNode(node, major, 42); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Stat(node, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != major || unix.Minor(st.Rdev) != 42 {
			t.Fatalf("%s: mode %o device %d:%d, want block device 7:42", node, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
	}
	if err := ensureBlockNode(node, major, 43); err == nil || !strings.Contains(err.Error(), "is not block device 7:43") {
		t.Errorf("a node of another device: %v, want a refusal", err)
	}
	plain := filepath.Join(dir, "file")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ensureBlockNode(plain, major, 1); err == nil {
		t.Error("a regular file at the node's path was accepted")
	}
}

// TestBackingFile: a device names the file it reads, and frees itself
// at its last close. Needs root (loop devices).
func TestBackingFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: loop devices; run `make test` as root")
	}
	image := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(image, bytes.Repeat([]byte{'x'}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	backing := func(dev string) string {
		t.Helper()
		file, err := BackingFile(dev)
		if err != nil {
			t.Fatal(err)
		}
		return file
	}
	dev, f, err := Attach(image, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := backing(dev); got != image {
		t.Fatalf("%s backs onto %q, want %s", dev, got, image)
	}
	f.Close()
	if got := backing(dev); got != "" {
		t.Errorf("after its last close %s still backs onto %q; want it freed (autoclear)", dev, got)
	}
}
