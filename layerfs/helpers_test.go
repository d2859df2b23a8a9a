package layerfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/continuity/sysx"
	"golang.org/x/sys/unix"
)

// requireRoot fails (never skips) a test that needs real mounts.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: this test makes real overlay mounts; run `make test` as root")
	}
}

// newTestStore opens a store in a fresh temp root and unmounts everything
// under it when the test ends, so a failed test leaves no mounts behind.
func newTestStore(t testing.TB, opts Options) *Store {
	t.Helper()
	requireRoot(t)
	if opts.Root == "" {
		opts.Root = t.TempDir()
	}
	t.Cleanup(func() {
		if err := unmountAll(opts.Root); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	// Before the unmounts above: lazily mounted layers hold lazyfs busy.
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("cleanup: close the store: %v", err)
		}
	})
	return s
}

func mustMount(t testing.TB, s *Store, id, cache string) string {
	t.Helper()
	v, err := s.Mount(context.Background(), id, MountOptions{Cache: mustRef(t, cache)})
	if err != nil {
		t.Fatalf("Mount(%s, %s): %v", id, cache, err)
	}
	return v.MergedPath
}

func mustCommit(t testing.TB, s *Store, id string) CommitResult {
	t.Helper()
	res, err := s.Commit(context.Background(), id)
	if err != nil {
		t.Fatalf("Commit(%s): %v", id, err)
	}
	return res
}

func mustRef(t testing.TB, s string) CacheRef {
	t.Helper()
	ref, err := ParseCacheRef(s)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func assertMissing(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("%s exists (err=%v), want it absent", path, err)
	}
}

// view mounts a fresh volume of cache, describes its tree and discards it.
func view(t testing.TB, s *Store, cache string) map[string]string {
	t.Helper()
	id := "view-" + randomID()
	v, err := s.Mount(context.Background(), id, MountOptions{Cache: mustRef(t, cache), Layout: cacheLayout(s, cache)})
	if err != nil {
		t.Fatalf("Mount(%s, %s): %v", id, cache, err)
	}
	merged := v.MergedPath
	snap := describeTree(t, merged)
	if err := s.Discard(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	return snap
}

// describeTree describes every entry of a tree: type, mode, owner, size,
// content hash, symlink target, device number, xattrs and hardlink group.
// Two trees are equal for users exactly when their descriptions are.
func describeTree(t testing.TB, root string) map[string]string {
	t.Helper()
	snap := map[string]string{}
	groups := map[uint64]string{} // inode -> first path, for hardlinks
	err := filepath.Walk(root, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode=%o uid=%d gid=%d", st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			desc += fmt.Sprintf(" size=%d sha=%s mtime=%d", st.Size, hex.EncodeToString(sum[:8]), st.Mtim.Nano())
			if st.Nlink > 1 {
				if first, ok := groups[st.Ino]; ok {
					desc += " link=" + first
				} else {
					groups[st.Ino] = rel
				}
			}
		case unix.S_IFLNK:
			target, _ := os.Readlink(path)
			desc += " -> " + target
		case unix.S_IFCHR, unix.S_IFBLK:
			desc += fmt.Sprintf(" rdev=%d", st.Rdev)
		}
		keys, _ := sysx.LListxattr(path)
		sort.Strings(keys)
		for _, k := range keys {
			v, _ := sysx.LGetxattr(path, k)
			desc += fmt.Sprintf(" %s=%q", k, v)
		}
		snap[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func diffSnapshots(want, got map[string]string) string {
	var b strings.Builder
	for k, v := range want {
		if got[k] != v {
			fmt.Fprintf(&b, "%s:\n  want %s\n  got  %s\n", k, v, got[k])
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "%s: unexpected %s\n", k, v)
		}
	}
	return b.String()
}

// smallFS mounts a fresh filesystem of kind "tmpfs" or "ext4" (a loop
// image) with size bytes and returns a directory on it for a store root.
// Small filesystems make full-disk and sparse-file tests fast and keep a
// failing test from filling the machine's disk. The mount goes away when
// the test ends; mount(8) sets loop devices to auto-clear, so the loop
// device goes with it.
func smallFS(t testing.TB, kind string, size int64) string {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	switch kind {
	case "tmpfs":
		must(t, unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)))
	case "ext4":
		img := filepath.Join(t.TempDir(), "fs.img")
		f, err := os.Create(img)
		must(t, err)
		must(t, f.Truncate(size))
		must(t, f.Close())
		// No reserved blocks: a full disk is full for root too.
		run(t, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", img)
		run(t, "mount", "-o", "loop", img, dir)
	default:
		t.Fatalf("smallFS: unknown kind %q", kind)
	}
	t.Cleanup(func() {
		if err := unmountAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	root := filepath.Join(dir, "store") // not the fs root, which holds lost+found
	must(t, os.Mkdir(root, 0o755))
	return root
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// fillDisk writes a file until the filesystem at dir is full and returns
// its path; removing it gives the space back.
func fillDisk(t testing.TB, dir string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "filler-")
	must(t, err)
	path := f.Name()
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for range 1 << 16 { // bounded: 4 GiB at most
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	// Smaller writes take the last partial chunk's space too.
	for range 1 << 10 {
		if _, err := f.Write(chunk[:512]); err != nil {
			break
		}
	}
	return path
}

// upperOf is the upper directory of volume id.
func upperOf(t testing.TB, s *Store, id string) string {
	t.Helper()
	r, err := s.readVolume(id)
	must(t, err)
	return s.upperDir(r)
}
