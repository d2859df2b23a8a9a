package kittest

import (
	"io/fs"
	"path"
	"testing"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/layerfs/storetest"
)

// The fake store the agent's tests use keeps the store contract where the
// agent looks, so that what those tests prove holds for the real store.
// Its volumes have no files: a build's writes are what it records of them.
func TestFakeStoreContract(t *testing.T) {
	var s *FakeStore // the current case's; the cases run one at a time
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) storetest.Store {
			s = NewFakeStore()
			s.buildWrites = 0
			return s
		},
		Write: func(t *testing.T, v *layerfs.Volume, name, content string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if dir, file := path.Split(name); dir == layerfs.ControlDir+"/" {
				s.Control[v.ID] = append(s.Control[v.ID], file)
				return
			}
			s.Written[v.ID] += int64(len(content))
		},
		// Neither a symlink nor a directory is a control file, and
		// neither, under the control directory, is a change.
		Make:   func(*testing.T, *layerfs.Volume, string, fs.FileMode) {},
		NoSync: true,
	})
}
