package layerfs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/layerfs/storetest"
)

// The real store keeps the store contract.
func TestStoreContract(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the store makes real overlay mounts; run `make test` as root")
	}
	storetest.Run(t, storetest.Harness{
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
	})
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
