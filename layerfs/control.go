package layerfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// ControlDir is the directory at a volume's root through which a build
// talks to the node agent (commit markers). It is removed from the upper
// layer before a commit, so it never lands in a cache.
const ControlDir = ".layercache"

// wroteControlFile reports whether the build that used volume r wrote
// the regular file ControlDir/name at the volume's root. Only the
// volume's own upper layer counts (or, once a commit started, the control
// directory it moved aside): a control file can never come from the
// cache, as commits take the control directory out of the layer. Ask
// after the volume's pods ended (End does).
func (s *Store) wroteControlFile(r *volumeRecord, name string) (bool, error) {
	// A commit under way may have moved the directory aside.
	for _, dir := range []string{filepath.Join(s.upperDir(r), ControlDir), s.controlAside(r.ID)} {
		if found, err := hasControlFile(dir, name); found || err != nil {
			return found, err
		}
	}
	return false, nil
}

// hasControlFile looks for the regular file name in the control directory
// dir. It Lstats each step: a build could have left a symlink at either
// place, which must neither count nor lead the agent out of the volume.
func hasControlFile(dir, name string) (bool, error) {
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return false, ignoreNotExist(err)
	}
	fi, err := os.Lstat(filepath.Join(dir, name))
	if err != nil {
		return false, ignoreNotExist(err)
	}
	return fi.Mode().IsRegular(), nil
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// stripControlDir removes the control directory from an upper layer that is
// about to become a layer, and makes the removal durable before the head
// names the layer: a crash must not bring it back inside a layer.
func stripControlDir(upper string) error {
	dir := filepath.Join(upper, ControlDir)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ondisk.FaultPoint()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove the control directory %s: %w", ControlDir, err)
	}
	return ondisk.SyncDir(upper)
}
