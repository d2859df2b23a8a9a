package layerfs

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// syncCrashFixture is a published three-layer chain, built once: the
// crash test needs it for every crash point.
var syncCrashFixture struct {
	chain Chain
	reg   registry
}

func syncFixture(t testing.TB) (Chain, registry) {
	if syncCrashFixture.reg == nil {
		src := newTestStore(t, Options{})
		buildChain(t, src, "ns/c", layerSteps)
		syncCrashFixture.reg = registry{}
		syncCrashFixture.chain = publish(t, src, syncCrashFixture.reg, "ns/c")
	}
	return syncCrashFixture.chain, syncCrashFixture.reg
}

// blobDir is where the crash test keeps a store's registry: the crash
// child reads it from there.
func blobDir(s *Store) string { return s.Root() + "-blobs" }

// setupSyncCrash gives s the chain's bottom layer and an unpublished
// commit on top, and writes the registry for the child.
func setupSyncCrash(t testing.TB, s *Store) {
	chain, reg := syncFixture(t)
	must(t, os.Mkdir(blobDir(s), 0o700))
	for d, data := range reg {
		must(t, os.WriteFile(filepath.Join(blobDir(s), strings.TrimPrefix(d, "sha256:")), data, 0o600))
	}
	data, err := json.Marshal(chain)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(blobDir(s), "chain.json"), data, 0o600))
	bottom := Chain{Generation: 1, Layers: chain.Layers[2:]}
	mustSync(t, s, "ns/c", bottom, reg.fetch)
	commitFiles(t, s, "ns/c", map[string]string{"local": "unpublished", "keep.txt": "local"})
}

// runSyncCrash syncs the whole chain from blobDir, one layer at a time so
// that the crash points come in a fixed order.
func runSyncCrash(ctx context.Context, s *Store) error {
	var chain Chain
	data, err := os.ReadFile(filepath.Join(blobDir(s), "chain.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &chain); err != nil {
		return err
	}
	fetch := func(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
		return os.Open(filepath.Join(blobDir(s), strings.TrimPrefix(l.Digest, "sha256:")))
	}
	_, err = s.Sync(ctx, CacheRef{"ns", "c"}, chain, fetch, SyncOptions{Parallel: 1})
	return err
}

// Overlay's own xattrs in a blob (a redirect, an origin) would make the
