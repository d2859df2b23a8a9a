package snapshot

import (
	"fmt"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Received is a generation made from another node's (Receive).
type Received struct {
	// Bytes is the generation's size, as a commit's generation measures.
	Bytes int64
	// Subvol is the subvolume that wrote the data (and its qgroup), the
	// lineage of a cache the generation starts (see Lineage).
	Subvol uint64
}

// Receive makes the read-only generation gen from what fill writes into
// an empty directory: a fresh node's copy of a published generation. It
// goes the way of a commit, so nothing of it is new to the area: fill
// writes into the writable subvolume of a volume named vol (no record
// names it, so a crash leaves it for the sweep), which is frozen as gen
// and then deleted. A generation left from a failed attempt is replaced.
// The caller holds the store so that the sweep cannot run meanwhile.
func (a *Area) Receive(vol, gen string, fill func(dir string) error) (rec Received, err error) {
	path := a.VolumePath(vol)
	if err := deleteSubvolume(path); err != nil {
		return rec, err
	}
	if err := makeEmptySubvolume(path); err != nil {
		return rec, err
	}
	defer func() {
		// The generation is a snapshot: the volume is not needed either way.
		if derr := deleteSubvolume(path); derr != nil && err == nil {
			err = derr
		}
	}()
	if err := fill(path); err != nil {
		return rec, fmt.Errorf("fill generation %s: %w", gen, err)
	}
	// The snapshot below commits a transaction, but the copy's data must
	// be on disk before the head names it, as a build's is at a commit.
	if err := ondisk.SyncFS(path); err != nil {
		return rec, fmt.Errorf("fill generation %s: %w", gen, err)
	}
	usage, err := a.VolumeUsage(vol)
	if err != nil {
		return rec, err
	}
	bytes, err := a.Freeze(vol, gen, usage, nil)
	if err != nil {
		return rec, err
	}
	return Received{Bytes: bytes, Subvol: usage.subvol.ID}, nil
}
