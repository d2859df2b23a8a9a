package layerfs

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// reserveBytes is space the store keeps allocated for itself, so that the
// few small writes that keep a volume usable on a full disk (a volume
// record, an overlay work directory) can still be made. It is released
// only by those writes, and taken again whenever there is room.
const reserveBytes = 1 << 20

func (s *Store) reservePath() string { return filepath.Join(s.root, "reserve") }

// refillReserve allocates the reserve if it is missing; best effort, since
// on a full disk there is nothing to allocate it from.
func (s *Store) refillReserve() {
	f, err := os.OpenFile(s.reservePath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) == nil && st.Blocks*512 >= reserveBytes {
		return
	}
	unix.Fallocate(int(f.Fd()), 0, 0, reserveBytes)
}

// withReserve runs fn; if it fails for lack of space, it releases the
// reserve and runs fn once more.
func (s *Store) withReserve(fn func() error) error {
	err := fn()
	if !isNoSpace(err) {
		return err
	}
	if terr := os.Truncate(s.reservePath(), 0); terr != nil {
		return err
	}
	return fn()
}

func isNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}
