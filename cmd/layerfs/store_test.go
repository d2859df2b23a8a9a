package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs"
)

// realStoreCLI gives a test a real store in a temp root (real overlay
// mounts, so root is needed) and a CLI call against it that must succeed.
func realStoreCLI(t *testing.T) (root string, cli func(args ...string) (stdout, stderr string)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: this test makes real overlay mounts; run `go test ./cmd/layerfs` as root")
	}
	root = t.TempDir()
	// Registered after TempDir, so it runs before the directory is removed.
	t.Cleanup(func() { cleanupStore(t, root) })
	return root, func(args ...string) (stdout, stderr string) {
		t.Helper()
		code, stdout, stderr := runCLI(t, append([]string{"--root", root}, args...)...)
		if code != exitOK {
			t.Fatalf("layerfs %s: exit status %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout, stderr
	}
}

// TestCLIWithRealStore drives the CLI in-process, exactly as a user would
// call it, against a real store in a temp root: real overlay mounts.
func TestCLIWithRealStore(t *testing.T) {
	root, cli := realStoreCLI(t)
	fails := func(wantCode int, wantStderr string, args ...string) {
		t.Helper()
		code, stdout, stderr := runCLI(t, append([]string{"--root", root}, args...)...)
		if code != wantCode || !strings.Contains(stderr, wantStderr) || stdout != "" {
			t.Fatalf("layerfs %s: exit status %d, stdout %q, stderr %q; want status %d and stderr containing %q",
				strings.Join(args, " "), code, stdout, stderr, wantCode, wantStderr)
		}
	}

	// mount prints the merged path, with the root's owner and mode as asked.
	out, _ := cli("mount", "build-1", "--cache", "ci/maven", "--writer", "ci/pod-1", "--uid", "1000", "--gid", "2000", "--mode", "0750")
	merged := strings.TrimSpace(out)
	if !strings.HasPrefix(merged, root+"/") || strings.Count(out, "\n") != 1 {
		t.Fatalf("mount printed %q, want one path under %s", out, root)
	}
	fi, err := os.Stat(merged)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o750 || st.Uid != 1000 || st.Gid != 2000 {
		t.Errorf("merged root has mode %v owner %d:%d, want 0750 1000:2000", fi.Mode(), st.Uid, st.Gid)
	}
	if err := os.WriteFile(filepath.Join(merged, "hello.txt"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if again, _ := cli("mount", "build-1", "--cache", "ci/maven"); again != out {
		t.Errorf("mounting again printed %q, want %q", again, out)
	}

	out, _ = cli("ls", "--volumes")
	if !strings.Contains(out, "VOLUME") || !hasRow(out, "build-1", "ci/maven", "0", "yes", merged) {
		t.Errorf("ls --volumes does not list build-1 as mounted:\n%s", out)
	}
	out, _ = cli("inspect", "--volume", "build-1")
	if !strings.Contains(out, "mount -t overlay overlay -o ") || !strings.Contains(out, merged) {
		t.Errorf("inspect --volume does not show the mount command:\n%s", out)
	}

	// commit prints the new generation; ls, inspect show it.
	if out, stderr := cli("commit", "build-1"); out != "1\n" || stderr != "" {
		t.Fatalf("commit printed %q, stderr %q; want \"1\\n\" and nothing", out, stderr)
	}
	out, _ = cli("ls")
	if !hasRow(out, "ci/maven", "1", "1") {
		t.Errorf("ls does not show ci/maven at generation 1 with 1 layer:\n%s", out)
	}
	if out, _ = cli("ls", "-q"); out != "ci/maven\n" {
		t.Errorf("ls -q printed %q", out)
	}
	out, _ = cli("ls", "-o", "json")
	var caches []layerfs.CacheInfo
	if err := json.Unmarshal([]byte(out), &caches); err != nil || len(caches) != 1 || caches[0].Generation != 1 {
		t.Errorf("ls -o json: %v\n%s", err, out)
	}
	info := inspectCache(t, cli, "ci/maven")
	if info.Cache.String() != "ci/maven" || info.Generation != 1 || len(info.Layers) != 1 || info.LastWriter != "ci/pod-1" || info.Bytes == 0 {
		t.Errorf("inspect -o json gave %+v", info)
	}
	if out, _ = cli("inspect", "ci/maven"); !strings.Contains(out, "ci/pod-1") || !strings.Contains(out, info.Layers[0].ID) {
		t.Errorf("inspect table lacks the writer or the layer:\n%s", out)
	}

	// A read-only volume sees the cache; discarding it changes nothing.
	merged = mountPath(t, cli, "pr-1", "--cache", "ci/maven", "--read-only")
	if data, err := os.ReadFile(filepath.Join(merged, "hello.txt")); err != nil || string(data) != "hello\n" {
		t.Errorf("a new volume does not see the committed file: %q, %v", data, err)
	}
	if err := os.WriteFile(filepath.Join(merged, "scratch"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ = cli("discard", "pr-1"); out != "pr-1\n" {
		t.Errorf("discard printed %q", out)
	}

	// A commit without changes keeps the generation and says so.
	merged = mountPath(t, cli, "build-2", "--cache", "ci/maven")
	if _, err := os.Stat(filepath.Join(merged, "scratch")); !os.IsNotExist(err) {
		t.Errorf("a discarded volume's file is visible: %v", err)
	}
	if out, stderr := cli("commit", "build-2"); out != "1\n" || !strings.Contains(stderr, "had no changes") {
		t.Errorf("empty commit printed %q, stderr %q", out, stderr)
	}

	// Squash merges the two layers; the view stays the same.
	merged = mountPath(t, cli, "build-3", "--cache", "ci/maven")
	if err := os.WriteFile(filepath.Join(merged, "second.txt"), []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ = cli("commit", "build-3"); out != "2\n" {
		t.Errorf("second commit printed %q, want 2", out)
	}
	if out, _ = cli("squash", "ci/maven"); !strings.HasPrefix(out, "nothing to squash") {
		t.Errorf("squash under the default limit printed %q", out)
	}
	if out, _ = cli("squash", "ci/maven", "--max-layers", "1"); !strings.HasPrefix(out, "squashed ci/maven: 2 layers into layer ") {
		t.Errorf("squash printed %q", out)
	}
	if info := inspectCache(t, cli, "ci/maven"); len(info.Layers) != 1 {
		t.Errorf("after squash the cache has %d layers, want 1", len(info.Layers))
	}
	merged = mountPath(t, cli, "build-4", "--cache", "ci/maven")
	for _, name := range []string{"hello.txt", "second.txt"} {
		if _, err := os.Stat(filepath.Join(merged, name)); err != nil {
			t.Errorf("after squash: %v", err)
		}
	}

	if out, _ = cli("gc", "--max-age", "0", "--max-bytes", "0"); !strings.HasPrefix(out, "gc: ") {
		t.Errorf("gc printed %q", out)
	}
	if info := inspectCache(t, cli, "ci/maven"); info.Generation != 2 {
		t.Errorf("gc without bounds changed the cache: %+v", info)
	}

	// Failures of the store exit 1 with the store's message.
	fails(exitFailure, "Run 'layerfs ls' to list caches", "commit", "no-such-volume")
	fails(exitFailure, "not found", "inspect", "ci/no-such-cache")
	fails(exitFailure, "not found", "inspect", "--volume", "no-such-volume")
	// Issue 8, item 10: squash of an unknown cache printed only "not found".
	fails(exitFailure, "squash cache ci/no-such-cache: not found\nRun 'layerfs ls' to list caches", "squash", "ci/no-such-cache")

	// Issue 8, item 10: the mode the CLI suggests works.
	out, _ = cli("mount", "shared-tmp", "--cache", "ci/tmp", "--mode", "01777")
	if fi, err := os.Stat(strings.TrimSpace(out)); err != nil || fi.Mode()&(os.ModeSticky|os.ModePerm) != os.ModeSticky|0o777 {
		t.Errorf("mount --mode 01777 gave root %v, %v; want drwxrwxrwt", fi, err)
	}
	cli("discard", "shared-tmp")
	cli("rm", "ci/tmp")

	// Removing the cache under a mounted volume drops that volume's commit.
	if err := os.WriteFile(filepath.Join(merged, "late.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ = cli("rm", "ci/maven"); out != "ci/maven\n" {
		t.Errorf("rm printed %q", out)
	}
	if out, stderr := cli("commit", "build-4"); !strings.Contains(stderr, "changes were dropped") {
		t.Errorf("commit after rm printed %q, stderr %q", out, stderr)
	}
	if out, _ = cli("ls", "-q"); out != "" {
		t.Errorf("ls -q after rm printed %q", out)
	}
	if out, _ = cli("ls", "--volumes", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("volumes left behind:\n%s", out)
	}

	// After a reboot the mounts are gone; recover puts them back.
	merged = mountPath(t, cli, "build-5", "--cache", "ci/gradle")
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
	if out, _ = cli("recover"); out != "remounted volume build-5\n" {
		t.Errorf("recover printed %q", out)
	}
	if out, _ = cli("ls", "--volumes"); !hasRow(out, "build-5", "ci/gradle", "0", "yes") {
		t.Errorf("recover did not remount build-5:\n%s", out)
	}
	if out, _ = cli("recover"); out != "recover: nothing to repair\n" {
		t.Errorf("second recover printed %q", out)
	}
	cli("discard", "build-5")
}

type cliFunc func(args ...string) (stdout, stderr string)

func mountPath(t *testing.T, cli cliFunc, args ...string) string {
	t.Helper()
	out, _ := cli(append([]string{"mount"}, args...)...)
	return strings.TrimSpace(out)
}

func inspectCache(t *testing.T, cli cliFunc, cache string) layerfs.CacheInfo {
	t.Helper()
	out, _ := cli("inspect", cache, "-o", "json")
	var info layerfs.CacheInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("inspect -o json is not JSON: %v\n%s", err, out)
	}
	return info
}

// hasRow tells whether a table has a row starting with these cells.
func hasRow(table string, cells ...string) bool {
	for _, line := range strings.Split(table, "\n") {
		fields := strings.Fields(line)
		if len(fields) >= len(cells) && strings.Join(fields[:len(cells)], " ") == strings.Join(cells, " ") {
			return true
		}
	}
	return false
}

// cleanupStore unmounts whatever a failed test left mounted, so that the
// temp root can be removed.
func cleanupStore(t *testing.T, root string) {
	ctx := context.Background()
	if store, err := layerfs.Open(ctx, layerfs.Options{Root: root}); err == nil {
		if vols, err := store.Volumes(ctx); err == nil {
			for _, v := range vols {
				if err := store.Discard(ctx, v.ID); err != nil {
					t.Logf("cleanup: discard %s: %v", v.ID, err)
				}
			}
		}
	}
	merged, _ := filepath.Glob(filepath.Join(root, "volumes", "*", "merged"))
	for _, m := range merged {
		unix.Unmount(m, unix.MNT_DETACH)
	}
}

// TestCLISharedLayers: a cache seeded from a fallback shares the
// fallback's layers; ls counts them in SHARED and inspect names the cache
// each is shared with, against a real store with real overlay mounts.
func TestCLISharedLayers(t *testing.T) {
	_, cli := realStoreCLI(t)
	build := func(volume, file string, args ...string) {
		t.Helper()
		merged := mountPath(t, cli, append([]string{volume}, args...)...)
		if err := os.WriteFile(filepath.Join(merged, file), []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		cli("commit", volume)
	}

	build("main-1", "main-1.txt", "--cache", "ci/main")
	build("main-2", "main-2.txt", "--cache", "ci/main")
	// Before any seeding the table is as it always was.
	if out, _ := cli("ls"); strings.Contains(out, "SHARED") {
		t.Errorf("ls without shared layers shows SHARED:\n%s", out)
	}
	build("pr-1-a", "pr-1.txt", "--cache", "ci/pr-1", "--fallback", "ci/main")
	build("other-1", "other.txt", "--cache", "ci/other")

	main, pr1 := inspectCache(t, cli, "ci/main"), inspectCache(t, cli, "ci/pr-1")
	if len(main.Layers) != 2 || len(pr1.Layers) != 3 || pr1.SeededFrom == nil {
		t.Fatalf("ci/main has %d layers, ci/pr-1 %d (seeded from %v); want 2 and 3 on top of them", len(main.Layers), len(pr1.Layers), pr1.SeededFrom)
	}
	out, _ := cli("ls")
	if !strings.Contains(out, "SEEDED FROM") || !strings.Contains(out, "SHARED") ||
		!hasRow(out, "ci/main", "2", "2") || !strings.HasSuffix(rowOf(out, "ci/main"), " 2") ||
		!strings.HasSuffix(rowOf(out, "ci/pr-1"), "ci/main@2 2") || !strings.HasSuffix(rowOf(out, "ci/other"), "- 0") {
		t.Errorf("ls does not count 2 shared layers in ci/main and ci/pr-1, none in ci/other:\n%s", out)
	}

	out, _ = cli("inspect", "ci/pr-1")
	if !strings.Contains(out, "SHARED WITH") || !hasRow(out, pr1.Layers[0].ID) || !strings.HasSuffix(rowOf(out, pr1.Layers[0].ID), " -") ||
		!strings.HasSuffix(rowOf(out, main.Layers[0].ID), " ci/main") || !strings.HasSuffix(rowOf(out, main.Layers[1].ID), " ci/main") {
		t.Errorf("inspect ci/pr-1 does not say its bottom 2 layers are shared with ci/main:\n%s", out)
	}
	out, _ = cli("inspect", "ci/main")
	if !strings.HasSuffix(rowOf(out, main.Layers[1].ID), " ci/pr-1") {
		t.Errorf("inspect ci/main does not say its layers are shared with ci/pr-1:\n%s", out)
	}
	if out, _ = cli("inspect", "ci/other"); strings.Contains(out, "SHARED WITH") {
		t.Errorf("inspect of a cache that shares nothing shows SHARED WITH:\n%s", out)
	}

	// Once the fallback is removed, nothing is shared any more; the seeded
	// cache keeps its layers.
	cli("rm", "ci/main")
	out, _ = cli("ls")
	if !strings.HasSuffix(rowOf(out, "ci/pr-1"), "ci/main@2 0") {
		t.Errorf("after removing ci/main, ls still counts shared layers in ci/pr-1:\n%s", out)
	}
	if info := inspectCache(t, cli, "ci/pr-1"); len(info.Layers) != 3 {
		t.Errorf("removing the fallback changed ci/pr-1: %d layers, want 3", len(info.Layers))
	}
}

// rowOf is the table row whose first cell is first, spaces collapsed; ""
// if there is none.
func rowOf(table, first string) string {
	for _, line := range strings.Split(table, "\n") {
		if fields := strings.Fields(line); len(fields) > 0 && fields[0] == first {
			return strings.Join(fields, " ")
		}
	}
	return ""
}
