package nodeagent

import (
	"path"
	"testing"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/layerfs/storetest"
)

// The fake store the agent's tests use keeps the store contract where the
// agent looks, so that what those tests prove holds for the real store.
// Its volumes have no files: a build's writes are what it records of them.
func TestFakeStoreContract(t *testing.T) {
	var s *fakeStore // the current case's; the cases run one at a time
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) storetest.Store {
			s = newFakeStore()
			s.buildWrites = 0
			return s
		},
		Write: func(t *testing.T, v *layerfs.Volume, name, content string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if dir, file := path.Split(name); dir == layerfs.ControlDir+"/" {
				s.control[v.ID] = append(s.control[v.ID], file)
				return
			}
			s.written[v.ID] += int64(len(content))
		},
		NoSync: true,
	})
}
