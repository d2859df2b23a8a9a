package ondisk

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WriteJSONAtomic replaces path with v as JSON: write a temp file in the same
// directory, fsync it, rename it over path, fsync the directory. A crash at
// any point leaves either the old or the new file, never a torn one.
func WriteJSONAtomic(path string, v any) (err error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp file for %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(append(data, '\n')); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	FaultPoint()
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s into place: %w", path, err)
	}
	FaultPoint()
	return SyncDir(dir)
}

// SyncDir makes a rename or create inside dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s to fsync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// SyncFS flushes the filesystem that holds path.
func SyncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	return nil
}

// RenameDurable renames oldPath to newPath and fsyncs both parents.
func RenameDurable(oldPath, newPath string) error {
	FaultPoint()
	if err := os.Rename(oldPath, newPath); err != nil {
		return err
	}
	FaultPoint()
	if err := SyncDir(filepath.Dir(newPath)); err != nil {
		return err
	}
	if filepath.Dir(oldPath) != filepath.Dir(newPath) {
		return SyncDir(filepath.Dir(oldPath))
	}
	return nil
}

// Exists tells whether something (a file, a directory, a dangling
// symlink) is at path.
func Exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
