package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// Whether a volume holds changes is read from btrfs itself: the inodes
// whose items changed since the volume's subvolume was made
// (changedInodes), which costs what the build changed, not what the cache
// holds. Two things are left out, as overlay's empty-upper check leaves
// them out: the store's private entry (Config.Private), and the root
// directory, whose inode changes whenever that entry comes or goes; the
// root's own entries are compared by name with what they were at the
// volume's birth (Subvolume.RootDigest).

// Changed tells whether volume id's subvolume differs from the generation
// it was made from in anything but the private entry; sub is what
// MakeVolume made. It syncs the filesystem first: btrfs
// records changes per transaction.
func (a *Area) Changed(id string, sub Subvolume) (bool, error) {
	path := a.VolumePath(id)
	if err := ondisk.SyncFS(path); err != nil {
		return false, err
	}
	info, err := subvolumeInfo(path)
	if err != nil {
		return false, err
	}
	changed, err := changedInodes(a.Dir(), info.Treeid, info.Otransid)
	if err != nil {
		return false, err
	}
	skip, err := a.privateInodes(path)
	if err != nil {
		return false, err
	}
	rootChanged := false
	for _, ino := range changed {
		switch {
		case ino == btrfsFirstFreeObjectID:
			rootChanged = true
		case !skip[ino]:
			return true, nil
		}
	}
	if !rootChanged {
		return false, nil
	}
	digest, err := a.rootDigest(path)
	return digest != sub.RootDigest, err
}

// privateInodes are the inode numbers of the private entry and what it
// holds (a few marker files).
func (a *Area) privateInodes(root string) (map[uint64]bool, error) {
	inos := map[uint64]bool{}
	dir := filepath.Join(root, a.cfg.Private)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return inos, nil
	} else if err != nil {
		return inos, err
	}
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if ino, ok := inodeOf(fi); ok {
			inos[ino] = true
		}
		return nil
	})
	return inos, err
}

// rootDigest sums the names of a volume root's entries (but the private
// one) and the root's owner and mode.
func (a *Area) rootDigest(root string) (string, error) {
	f, err := os.Open(root)
	if err != nil {
		return "", err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return "", fmt.Errorf("list %s: %w", root, err)
	}
	slices.Sort(names)
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s %v\n", fi.Mode(), ownerOf(fi))
	for _, n := range names {
		if n != a.cfg.Private {
			fmt.Fprintf(h, "%q\n", n)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func inodeOf(fi os.FileInfo) (uint64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Ino, true
}

func ownerOf(fi os.FileInfo) [2]uint32 {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return [2]uint32{}
	}
	return [2]uint32{st.Uid, st.Gid}
}
