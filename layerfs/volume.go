package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/overlay"
	"github.com/layercache/layercache/layerfs/snapshot"
)

// volumeRecord is volumes/<id>/volume.json.
type volumeRecord struct {
	Volume
	CacheUID string `json:"cacheUID"`
	// Upper is the layer the volume's upper directory will be: it lives at
	// layers/<Upper> from the volume's birth, so that a commit moves
	// nothing (a snapshot volume's commit makes it its generation's id).
	Upper    string      `json:"upper,omitempty"`
	RootMode os.FileMode `json:"rootMode"`
	RootUID  int         `json:"rootUID"`
	RootGID  int         `json:"rootGID"`
	// Lifted mount restrictions (MountOptions); records of older versions
	// lack them, so their remounts get the new, safer default.
	AllowSetuid  bool `json:"allowSetuid,omitempty"`
	AllowDevices bool `json:"allowDevices,omitempty"`
	// BootID is the kernel boot the volume was last mounted in; a volatile
	// mount marker found after another boot means a possibly torn upper.
	BootID string `json:"bootID,omitempty"`
	// Subvolume is a snapshot volume's btrfs subvolume; its fields are
	// the record's (subvolID, rootDigest), empty for an overlay volume.
	snapshot.Subvolume
	// SeedLayers are the fallback's layers (as Layers, with their sizes)
	// that a seeded volume's commit puts under its layer when it creates
	// the cache: the fallback may be squashed or removed meanwhile, and
	// the record naming them is what keeps them (see seed.go).
	SeedLayers []LayerInfo `json:"seedLayers,omitempty"`
	// SeedQgroups are the lineage (head.Qgroups) of the generation a
	// seeded snapshot volume is a snapshot of: the cache its commit
	// creates holds their data too, and its size counts them.
	SeedQgroups []uint64 `json:"seedQgroups,omitempty"`
	// LazyLayers are the layers of Layers that were partial when the
	// volume was mounted: its overlay reads them through their lazyfs
	// files for as long as it lives, settled or not, so a lazyfs that
	// ended meanwhile may have failed its reads (lazyfsLost).
	LazyLayers []string `json:"lazyLayers,omitempty"`
}

func (s *Store) volumeDir(id string) string  { return filepath.Join(s.volumesDir(), id) }
func (s *Store) volumePath(id string) string { return filepath.Join(s.volumeDir(id), "volume.json") }
func (s *Store) workDir(id string) string    { return filepath.Join(s.volumeDir(id), "work") }
func (s *Store) mergedDir(id string) string  { return filepath.Join(s.volumeDir(id), "merged") }

// controlAside is where a commit moves the volume's control directory, so
// that the markers that decided the commit outlive a crash without ever
// being inside the layer.
func (s *Store) controlAside(id string) string { return filepath.Join(s.volumeDir(id), "control") }

// upperDir is where the volume's build writes.
func (s *Store) upperDir(r *volumeRecord) string { return s.layoutOf(r.Layout).upperDir(r) }

func (s *Store) volumeSpec(r *volumeRecord) overlay.Spec {
	return overlay.Spec{
		Lower: s.lowerDirs(r.Layers), Upper: s.upperDir(r), Work: s.workDir(r.ID),
		AllowSetuid: r.AllowSetuid, AllowDevices: r.AllowDevices,
	}
}

// landedIn tells whether the volume's upper directory is a layer of h: the
// volume was committed, and only its record remains.
// A seeded volume may land on a head made after it was mounted, whose
// UID it cannot know (see land); its upper layer's random id alone tells.
func (r *volumeRecord) landedIn(h *head) bool {
	return h != nil && r.Upper != "" && (h.UID == r.CacheUID || r.SeededFrom != nil) && h.hasLayer(r.Upper)
}

// readVolumeRecord reads a volume's record as it is on disk.
func (s *Store) readVolumeRecord(id string) (*volumeRecord, error) {
	var r volumeRecord
	if err := readJSON(s.volumePath(id), &r); err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("volume %q: %w", id, ErrNotFound)
		}
		return nil, err
	}
	r.MergedPath = s.mergedDir(id)
	r.Mounted = ondisk.IsMountPoint(r.MergedPath)
	r.Layout = r.Layout.orDefault()
	return &r, nil
}

// readVolume reads a volume without its lock; ErrNotFound for one that
// does not exist or has ended (see landedIn).
func (s *Store) readVolume(id string) (*volumeRecord, error) {
	r, err := s.readVolumeRecord(id)
	if err != nil {
		return nil, err
	}
	if s.landed(r) {
		return nil, fmt.Errorf("volume %q: committed: %w", id, ErrNotFound)
	}
	return r, nil
}

// landed tells whether r's commit landed, as its cache's head reads
// now, without the cache's lock.
func (s *Store) landed(r *volumeRecord) bool {
	h, err := s.readHead(r.Cache)
	return err == nil && r.landedIn(h)
}

// endLandedVolumes removes the records of cache's volumes whose commit
// landed (a crash came between the head's write and the record's
// removal) before a squash takes their layers out of the head: after
// that, nothing would tell them from live volumes.
func (s *Store) endLandedVolumes(ctx context.Context, cache CacheRef) error {
	entries, err := os.ReadDir(s.volumesDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		r, err := s.readVolumeRecord(e.Name())
		if err != nil || r.Cache != cache {
			continue // not a volume, or being created or removed
		}
		if h, err := s.readHead(cache); err != nil || !r.landedIn(h) {
			continue
		}
		// The transaction sees the volume ended; its save removes it.
		if err := s.transact(ctx, scope{volume: r.ID}, func(*txn) error { return nil }); err != nil {
			return err
		}
	}
	return nil
}

// removeVolumeDir removes a volume's directory. The record goes first, so
// a crash midway leaves no half volume that Volumes would report; Recover
// removes the rest. Not fsynced: a removal that a crash undoes is replayed
// by the caller, and every caller's operation is idempotent.
func (s *Store) removeVolumeDir(id string) error {
	ondisk.FaultPoint()
	if err := os.Remove(s.volumePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove volume %q: %w", id, err)
	}
	ondisk.FaultPoint()
	if err := os.RemoveAll(s.volumeDir(id)); err != nil {
		return fmt.Errorf("remove volume %q: %w", id, err)
	}
	return nil
}

// Volume reports one volume.
func (s *Store) Volume(ctx context.Context, volumeID string) (*Volume, error) {
	if err := ValidateName("volume", volumeID); err != nil {
		return nil, err
	}
	r, err := s.readVolume(volumeID)
	if err != nil {
		return nil, err
	}
	return &r.Volume, nil
}

// Volumes reports every volume, sorted by id.
func (s *Store) Volumes(ctx context.Context) ([]Volume, error) {
	recs, err := s.volumeRecords()
	if err != nil {
		return nil, err
	}
	vols := make([]Volume, len(recs))
	for i, r := range recs {
		vols[i] = r.Volume
	}
	return vols, nil
}

func (s *Store) volumeRecords() ([]*volumeRecord, error) {
	entries, err := os.ReadDir(s.volumesDir())
	if err != nil {
		return nil, err
	}
	var recs []*volumeRecord
	for _, e := range entries {
		if isTemp(e.Name()) || ValidateName("volume", e.Name()) != nil {
			continue
		}
		r, err := s.readVolume(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue // being created or removed
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].ID < recs[j].ID })
	return recs, nil
}

// MountCommand returns the `mount -t overlay ...` line equivalent to the
// volume's mount, for debugging.
func (s *Store) MountCommand(ctx context.Context, volumeID string) (string, error) {
	if err := ValidateName("volume", volumeID); err != nil {
		return "", err
	}
	r, err := s.readVolume(volumeID)
	if err != nil {
		return "", err
	}
	return s.layoutOf(r.Layout).mountCommand(r), nil
}
