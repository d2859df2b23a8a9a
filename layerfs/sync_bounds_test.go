package layerfs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

// A chain is a tenant's word (issue 33, finding 2): a Sync bounds the
// whole of what it fetches, not only each layer, and checks it before the
// first byte.
func TestSyncBoundsTheWholeChainBeforeFetching(t *testing.T) {
	ctx := context.Background()
	reg := registry{}
	a := newTestStore(t, Options{})
	commitFiles(t, a, "ns/c", map[string]string{"f": "x"})
	chain := publish(t, a, reg, "ns/c")
	var fetches int
	counting := func(ctx context.Context, l ChainLayer) (io.ReadCloser, error) {
		fetches++
		return reg.fetch(ctx, l)
	}

	for _, tc := range []struct {
		name  string
		chain Chain
		want  string
		is    error
	}{{
		name:  "one blob listed many times",
		chain: Chain{Generation: 3, Layers: []ChainLayer{chain.Layers[0], chain.Layers[0], chain.Layers[0]}},
		want:  "repeats the digest",
	}, {
		name: "more than the disk holds",
		chain: Chain{Generation: 1, Layers: []ChainLayer{{
			Digest: chain.Layers[0].Digest, Size: 1 << 60, Format: chain.Layers[0].Format,
		}}},
		want: "but the store's filesystem has",
		is:   ErrNoSpace,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestStore(t, Options{})
			fetches = 0
			_, err := b.Sync(ctx, mustRef(t, "ns/c"), tc.chain, counting, SyncOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("Sync = %v, want an error containing %q", err, tc.want)
			}
			if fetches != 0 {
				t.Errorf("Sync fetched %d layers of a chain it refuses, want none", fetches)
			}
			if _, err := b.Inspect(ctx, mustRef(t, "ns/c")); !errors.Is(err, ErrNotFound) {
				t.Errorf("a refused Sync left the cache: %v", err)
			}
			assertNoOrphans(t, b)
		})
	}
}

// A layer image is a tenant's bytes (issue 33, finding 7): one whose
// digest matches what was pushed, but whose metadata this store never
// writes, is refused before the kernel mounts it, and nothing of it stays.
func TestSyncRefusesAnImageTheStoreDidNotWrite(t *testing.T) {
	ctx := context.Background()
	reg := registry{}
	a := newTestStore(t, Options{})
	commitFiles(t, a, "ns/c", map[string]string{"f": "x"})
	chain := publish(t, a, reg, "ns/c")

	// One more inode in the superblock than the tree holds, pushed under
	// its own digest, as a tenant with the registry's credentials can.
	img := bytes.Clone(reg[chain.Layers[0].Digest])
	const inodes = 1024 + 16 // the superblock's inode count
	binary.LittleEndian.PutUint64(img[inodes:], binary.LittleEndian.Uint64(img[inodes:])+1)
	forged := chain
	forged.Layers = []ChainLayer{chain.Layers[0]}
	forged.Layers[0].Digest = reg.put(img)

	b := newTestStore(t, Options{})
	_, err := b.Sync(ctx, mustRef(t, "ns/c"), forged, reg.fetch, SyncOptions{})
	if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "the superblock says") {
		t.Fatalf("Sync of a forged image = %v, want ErrInvalidImage naming the inode count", err)
	}
	if _, err := b.Inspect(ctx, mustRef(t, "ns/c")); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused Sync left the cache: %v", err)
	}
	assertNoOrphans(t, b)
}
