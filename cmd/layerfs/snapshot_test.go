package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The snapshot layout through the CLI: --layout on mount, the LAYOUT
// column of ls, the layout in inspect, and a refusal naming both layouts.
func TestCLISnapshotLayout(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: this test makes real btrfs mounts; run `go test ./cmd/layerfs` as root")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Fatal("needs mkfs.btrfs: install btrfs-progs (make test-deps)")
	}
	root := t.TempDir()
	t.Cleanup(func() {
		cleanupStore(t, root)
		if err := unix.Unmount(filepath.Join(root, "snapshot"), 0); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Error(err)
		}
	})
	cli := func(args ...string) (int, string, string) {
		return runCLI(t, append([]string{"--root", root, "--snapshot-image-size", "1Gi"}, args...)...)
	}
	code, out, stderr := cli("mount", "b1", "--cache", "ci/buildkit", "--layout", "snapshot")
	if code != exitOK {
		t.Fatalf("mount --layout snapshot: %d %s", code, stderr)
	}
	if err := os.WriteFile(filepath.Join(strings.TrimSpace(out), "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := cli("commit", "b1"); code != exitOK || out != "1\n" {
		t.Fatalf("commit: %d %q %s", code, out, stderr)
	}
	if code, _, _ := cli("mount", "o1", "--cache", "ci/maven"); code != exitOK {
		t.Fatal("overlay mount beside a snapshot cache failed")
	}
	_, out, _ = cli("ls")
	if !strings.Contains(out, "LAYOUT") || !hasRow(out, "ci/buildkit", "1", "1") || !strings.Contains(out, "snapshot") || !strings.Contains(out, "overlay") {
		t.Errorf("ls does not show each cache's layout:\n%s", out)
	}
	if _, out, _ = cli("inspect", "ci/buildkit"); !strings.Contains(out, "Layout:") {
		t.Errorf("inspect does not show the layout:\n%s", out)
	}
	code, _, stderr = cli("mount", "b2", "--cache", "ci/buildkit", "--layout", "overlay")
	if code == exitOK || !strings.Contains(stderr, "snapshot") || !strings.Contains(stderr, "overlay") {
		t.Errorf("mount with the other layout: status %d, stderr %q; want a failure naming both layouts", code, stderr)
	}
	if code, _, stderr := cli("mount", "b3", "--cache", "ci/buildkit", "--layout", "zfs"); code != exitUsage || !strings.Contains(stderr, "snapshot") {
		t.Errorf("--layout zfs: status %d, stderr %q; want a usage error listing the layouts", code, stderr)
	}
}
