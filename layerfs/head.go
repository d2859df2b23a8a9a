package layerfs

import (
	"os"
	"time"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// head is a cache's state: caches/<namespace>/<name>/head.json. It is the
// single source of truth for which layers a cache has.
type head struct {
	Cache CacheRef `json:"cache"`
	// UID names this incarnation of the cache, so that a volume mounted
	// before the cache was removed cannot commit into its successor.
	UID        string      `json:"uid"`
	Generation int64       `json:"generation"`
	Layers     []LayerInfo `json:"layers"` // newest first
	Created    time.Time   `json:"created"`
	LastUsed   time.Time   `json:"lastUsed"`
	LastWriter string      `json:"lastWriter,omitempty"`
	// ChainGeneration is the generation of the last chain Sync applied,
	// so that a stale read of the chain cannot roll the cache back.
	ChainGeneration int64 `json:"chainGeneration,omitempty"`
	// Layout is the cache's layout for life; "" is overlay (heads made
	// before layouts existed stay byte for byte as they were). A
	// snapshot cache's Layers hold one entry: its head generation, a
	// read-only subvolume at snapshot/generations/<id>.
	Layout Layout `json:"layout,omitempty"`
	// Qgroups are the subvolume ids of the volumes whose commits made a
	// snapshot cache (with simple quotas, the data is charged to them for
	// as long as a generation holds it): the cache's size is their sum.
	Qgroups []uint64 `json:"qgroups,omitempty"`
	// SeededFrom is the fallback whose layers the cache was created on
	// (seed.go); they stay at the bottom of Layers until a squash.
	SeededFrom *Seed `json:"seededFrom,omitempty"`
}

func (h *head) layerIDs() []string {
	ids := make([]string, len(h.Layers))
	for i, l := range h.Layers {
		ids[i] = l.ID
	}
	return ids
}

func (h *head) hasLayer(id string) bool { return h.layerIndex(id) >= 0 }

// layerIndex is the position of layer id in the head, -1 if absent.
func (h *head) layerIndex(id string) int {
	for i, l := range h.Layers {
		if l.ID == id {
			return i
		}
	}
	return -1
}

func (h *head) bytes() int64 {
	var n int64
	for _, l := range h.Layers {
		n += l.Bytes
	}
	return n
}

// readHead loads a cache's head; ErrNotFound if the cache does not exist.
func (s *Store) readHead(c CacheRef) (*head, error) {
	var h head
	if err := readJSON(s.headPath(c), &h); err != nil {
		return nil, err
	}
	return &h, nil
}

func (s *Store) writeHead(h *head) error {
	if err := os.MkdirAll(s.cacheDir(h.Cache), 0o711); err != nil {
		return err
	}
	return ondisk.WriteJSONAtomic(s.headPath(h.Cache), h)
}

func (s *Store) lowerDirs(ids []string) []string {
	if len(ids) == 0 {
		return []string{s.emptyLayer()}
	}
	dirs := make([]string, len(ids))
	for i, id := range ids {
		dirs[i] = s.layerDir(id)
	}
	return dirs
}
