package layerfs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// Whether a snapshot volume holds changes is read from btrfs itself: the
// inodes whose items changed since the volume's subvolume was made
// (changedInodes), which costs what the build changed, not what the cache
// holds. Two things are left out, as overlay's upperIsEmpty leaves them
// out: the control directory, and the root directory, whose inode changes
// whenever the control directory comes or goes; the root's own entries
// are compared by name with what they were at the volume's birth.

// snapshotChanged tells whether the volume's subvolume differs from the
// generation it was made from in anything but the control directory.
// It syncs the filesystem first: btrfs records changes per transaction.
func (s *Store) snapshotChanged(r *volumeRecord) (bool, error) {
	path := s.snapVolumePath(r.ID)
	if err := syncFS(path); err != nil {
		return false, err
	}
	info, err := subvolumeInfo(path)
	if err != nil {
		return false, err
	}
	changed, err := changedInodes(s.snapshotDir(), info.Treeid, info.Otransid)
	if err != nil {
		return false, err
	}
	skip, err := controlInodes(path)
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
	digest, err := rootDigest(path)
	return digest != r.RootDigest, err
}

// controlInodes are the inode numbers of the control directory and what
// it holds (a few marker files).
func controlInodes(root string) (map[uint64]bool, error) {
	inos := map[uint64]bool{}
	dir := filepath.Join(root, ControlDir)
	if _, err := os.Lstat(dir); err != nil {
		return inos, ignoreNotExist(err)
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

// rootDigest sums the names of a volume root's entries (but the control
// directory) and the root's owner and mode.
func rootDigest(root string) (string, error) {
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
		if n != ControlDir {
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
