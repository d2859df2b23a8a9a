package layerfs_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/layerfs/storetest"
)

// The real store keeps the store contract.
func TestStoreContract(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the store makes real overlay mounts; run `make test` as root")
	}
	storetest.Run(t, contractHarness())
}

// contractHarness runs the suite on overlay stores in fresh temp roots.
func contractHarness() storetest.Harness {
	return storetest.Harness{
		New: func(t *testing.T) storetest.Store {
			s, err := layerfs.Open(context.Background(), layerfs.Options{Root: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { discardAll(t, s) })
			return s
		},
		Write: func(t *testing.T, v *layerfs.Volume, name, content string) {
			p := filepath.Join(v.MergedPath, filepath.FromSlash(name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		},
		Make: func(t *testing.T, v *layerfs.Volume, name string, kind fs.FileMode) {
			p := filepath.Join(v.MergedPath, filepath.FromSlash(name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			var err error
			switch kind {
			case fs.ModeDir:
				err = os.Mkdir(p, 0o755)
			case fs.ModeSymlink:
				err = os.Symlink(os.Args[0], p) // a regular file outside the volume
			default:
				t.Fatalf("Make of kind %v", kind)
			}
			if err != nil {
				t.Fatal(err)
			}
		},
		Read: func(t *testing.T, v *layerfs.Volume, name string) (string, bool) {
			b, err := os.ReadFile(filepath.Join(v.MergedPath, filepath.FromSlash(name)))
			if errors.Is(err, os.ErrNotExist) {
				return "", false
			}
			if err != nil {
				t.Fatal(err)
			}
			return string(b), true
		},
	}
}

// Snapshot stores keep the contract too, but for squash, which the
// layout does not have (see storetest.Harness.Layout).
func TestStoreContractSnapshot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the store makes real btrfs mounts; run `make test` as root")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Fatal("needs mkfs.btrfs: install btrfs-progs (make test-deps)")
	}
	h := contractHarness()
	h.Layout = layerfs.LayoutSnapshot
	h.New = func(t *testing.T) storetest.Store {
		root := t.TempDir()
		s, err := layerfs.Open(context.Background(), layerfs.Options{Root: root, SnapshotImageBytes: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unmountUnder(t, root) })
		t.Cleanup(func() { discardAll(t, s) })
		return s
	}
	storetest.Run(t, h)
}

// unmountUnder unmounts the snapshot image a case's store mounted.
func unmountUnder(t *testing.T, root string) {
	err := unix.Unmount(filepath.Join(root, "snapshot"), 0)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) { // never mounted
		t.Error(err)
	}
}

// discardAll unmounts what a case left, so that the temp dir can go.
func discardAll(t *testing.T, s *layerfs.Store) {
	vols, err := s.Volumes(context.Background())
	if err != nil {
		t.Error(err)
		return
	}
	for _, v := range vols {
		if err := s.Discard(context.Background(), v.ID); err != nil {
			t.Error(err)
		}
	}
}
