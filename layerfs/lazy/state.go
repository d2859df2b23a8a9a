package lazy

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"os"

	"github.com/opencontainers/go-digest"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// stateVersion is the state file's format; another version is not
// trusted (the copy starts over).
const stateVersion = 1

// state is the state file: which chunks of the copy are fsynced and, when
// the image has a digest, whether the complete copy matched it. The
// geometry and the digest say which image the record is of.
type state struct {
	Version   int           `json:"version"`
	Size      int64         `json:"size"`
	ChunkSize int64         `json:"chunkSize"`
	Chunks    int           `json:"chunks"`
	Digest    digest.Digest `json:"digest,omitempty"`
	Have      []byte        `json:"have"` // bit i: chunk i is recorded
	Verified  bool          `json:"verified,omitempty"`
}

func statePath(path string) string { return path + ".state" }

// loadState reads the record of the copy that o describes; a missing,
// unreadable or foreign record (another image's geometry or digest, bits
// beyond the chunk count) is nil with the reason, and the copy starts
// over.
func loadState(o Options) (*bitset, bool, string) {
	data, err := os.ReadFile(statePath(o.Path))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, "no state file"
	}
	if err != nil {
		return nil, false, err.Error()
	}
	var s state
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, false, fmt.Sprintf("state file: %v", err)
	}
	chunks := chunkCount(o.Size, o.ChunkSize)
	switch {
	case s.Version != stateVersion:
		return nil, false, fmt.Sprintf("state file version %d, want %d", s.Version, stateVersion)
	case s.Size != o.Size || s.ChunkSize != o.ChunkSize || s.Chunks != chunks:
		return nil, false, fmt.Sprintf("state file of size %d in %d chunks of %d, want size %d in %d chunks of %d", s.Size, s.Chunks, s.ChunkSize, o.Size, chunks, o.ChunkSize)
	case s.Digest != o.Digest:
		return nil, false, fmt.Sprintf("state file of image %q, want %q", s.Digest, o.Digest)
	}
	have, err := bitsetFrom(s.Have, chunks)
	if err != nil {
		return nil, false, fmt.Sprintf("state file: %v", err)
	}
	return have, s.Verified && o.Digest != "", ""
}

// saveState records have atomically (ondisk.WriteJSONAtomic); the chunks
// it holds must be fsynced in the copy already.
func saveState(o Options, have *bitset, verified bool) error {
	return ondisk.WriteJSONAtomic(statePath(o.Path), state{
		Version: stateVersion, Size: o.Size, ChunkSize: o.ChunkSize, Chunks: have.n,
		Digest: o.Digest, Have: have.bytes(), Verified: verified,
	})
}

// bitset is a set of chunk indexes.
type bitset struct {
	w     []uint64
	n     int // the chunk count
	count int
}

func newBitset(n int) *bitset { return &bitset{w: make([]uint64, (n+63)/64), n: n} }

func (b *bitset) has(i int) bool { return b.w[i/64]&(1<<(i%64)) != 0 }

func (b *bitset) add(i int) {
	if !b.has(i) {
		b.w[i/64] |= 1 << (i % 64)
		b.count++
	}
}

func (b *bitset) full() bool { return b.count == b.n }

func (b *bitset) clone() *bitset {
	return &bitset{w: append([]uint64(nil), b.w...), n: b.n, count: b.count}
}

// bytes is b as the state file's bitmap: bit i%8 of byte i/8.
func (b *bitset) bytes() []byte {
	out := make([]byte, (b.n+7)/8)
	for i := range out {
		out[i] = byte(b.w[i/8] >> (8 * (i % 8)))
	}
	return out
}

// bitsetFrom reads a state file's bitmap of n chunks; a bitmap of another
// length, or with bits beyond n, is not one of n chunks.
func bitsetFrom(p []byte, n int) (*bitset, error) {
	if len(p) != (n+7)/8 {
		return nil, fmt.Errorf("bitmap of %d bytes, want %d for %d chunks", len(p), (n+7)/8, n)
	}
	b := newBitset(n)
	for i, v := range p {
		b.w[i/8] |= uint64(v) << (8 * (i % 8))
	}
	if n%64 != 0 && b.w[len(b.w)-1]>>(n%64) != 0 {
		return nil, fmt.Errorf("bitmap has bits beyond its %d chunks", n)
	}
	for _, w := range b.w {
		b.count += bits.OnesCount64(w)
	}
	return b, nil
}
