package layerfs

import (
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
	requireRoot(t)
	dir := t.TempDir()
	node := filepath.Join(dir, "loop42")
	for range 2 { // made, then found
		must(t, ensureBlockNode(node, loopMajor, 42))
		var st unix.Stat_t
		must(t, unix.Stat(node, &st))
		if st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != loopMajor || unix.Minor(st.Rdev) != 42 {
			t.Fatalf("%s: mode %o device %d:%d, want block device 7:42", node, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
	}
	if err := ensureBlockNode(node, loopMajor, 43); err == nil || !strings.Contains(err.Error(), "is not block device 7:43") {
		t.Errorf("a node of another device: %v, want a refusal", err)
	}
	plain := filepath.Join(dir, "file")
	must(t, os.WriteFile(plain, nil, 0o600))
	if err := ensureBlockNode(plain, loopMajor, 1); err == nil {
		t.Error("a regular file at the node's path was accepted")
	}
}
