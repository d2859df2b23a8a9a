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

// TestChangeFile: a read-only device switches to a file of its size and
// frees itself at its last close; a writable device, or a file of
// another size, is refused. Needs root (loop devices).
func TestChangeFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: loop devices; run `make test` as root")
	}
	dir := t.TempDir()
	write := func(name string, size int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte{'x'}, size), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	remote, local, other := write("remote", 1<<20), write("local", 1<<20), write("other", 2<<20)
	backing := func(dev string) string {
		t.Helper()
		file, err := BackingFile(dev)
		if err != nil {
			t.Fatal(err)
		}
		return file
	}

	dev, f, err := Attach(remote, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := backing(dev); got != remote {
		t.Fatalf("%s backs onto %q, want %s", dev, got, remote)
	}
	if err := ChangeFile(dev, other); err == nil {
		t.Error("switched to a file of another size")
	}
	if err := ChangeFile(dev, local); err != nil {
		t.Fatal(err)
	}
	if got := backing(dev); got != local {
		t.Errorf("after the switch %s backs onto %q, want %s", dev, got, local)
	}
	f.Close()
	if got := backing(dev); got != "" {
		t.Errorf("after its last close %s still backs onto %q; want it freed (autoclear)", dev, got)
	}

	dev, f, err = Attach(remote, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ChangeFile(dev, local); err == nil {
		t.Errorf("writable device %s switched files", dev)
	}
}
