package layerfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/layercache/layercache/layerfs/flock"
	"github.com/layercache/layercache/layerfs/ondisk"
)

// Every change to heads and volume records goes through transact, as every
// change of containerd's snapshotters goes through one WithTransaction:
// take the locks (order: store, volume, cache), read, let a closure change
// what it read, write what changed atomically (temp, fsync, rename), and
// release the locks on every path.

// scope names what a transaction locks and reads.
type scope struct {
	// store takes the store lock shared: the transaction creates
	// references to layers, which the sweep must not remove meanwhile.
	store bool
	// volume is a volume to lock and read. The cache it belongs to is
	// locked and read too, or cache if there is no such volume.
	volume string
	cache  CacheRef
	// cacheLater leaves the volume's cache unlocked and unread until the
	// closure calls lockCache: a commit seals its volume first, which
	// needs only the volume's lock, so that the commits of one cache
	// queue for its lock only to write its head.
	cacheLater bool
}

// txn is what a transaction read. The closure changes Volume and Head;
// nil removes the volume or the cache.
type txn struct {
	s      *Store
	ctx    context.Context
	Volume *volumeRecord
	Head   *head
	volID  string
	cache  CacheRef
	// As last read or written, to tell what changed; nil if absent.
	savedVolume, savedHead []byte
	locks                  []func() // releases what was locked, in order
}

// transact runs fn in a transaction over sc and saves what it changed.
func (s *Store) transact(ctx context.Context, sc scope, fn func(t *txn) error) error {
	t := &txn{s: s, ctx: ctx, volID: sc.volume, cache: sc.cache}
	defer t.release()
	if err := t.lockAndRead(ctx, sc); err != nil {
		return err
	}
	if err := fn(t); err != nil {
		return err
	}
	return t.save()
}

// release undoes whatever was locked, newest first.
func (t *txn) release() {
	for i := len(t.locks) - 1; i >= 0; i-- {
		t.locks[i]()
	}
	t.locks = nil
}

// lockAndRead takes the locks of sc and reads what they guard; a lock
// file whose object does not exist on disk goes when released, so that
// unknown and removed names leave no trace.
func (t *txn) lockAndRead(ctx context.Context, sc scope) (err error) {
	if sc.store {
		l, err := t.s.lockStore(ctx, false)
		if err != nil {
			return err
		}
		t.locks = append(t.locks, l.Unlock)
	}
	if sc.volume != "" {
		l, err := t.s.lockVolume(ctx, sc.volume)
		if err != nil {
			return err
		}
		t.locks = append(t.locks, func() { unlockUnless(l, ondisk.Exists(t.s.volumePath(sc.volume))) })
		if t.Volume, err = t.s.readVolumeRecord(sc.volume); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if t.Volume != nil {
			t.cache = t.Volume.Cache
		}
	}
	if t.savedVolume, err = encodeOrNil(t.Volume); err != nil {
		return err
	}
	if t.cache == (CacheRef{}) || sc.cacheLater {
		return nil
	}
	return t.lockCache(ctx)
}

// lockCache locks and reads the transaction's cache (see scope.cacheLater).
func (t *txn) lockCache(ctx context.Context) (err error) {
	l, err := t.s.lockCache(ctx, t.cache)
	if err != nil {
		return err
	}
	t.locks = append(t.locks, func() { unlockUnless(l, ondisk.Exists(t.s.headPath(t.cache))) })
	if t.Head, err = t.s.readHead(t.cache); errors.Is(err, ErrNotFound) {
		t.Head = nil
	} else if err != nil {
		return fmt.Errorf("cache %s: %w", t.cache, err)
	}
	return t.recordRead()
}

// recordRead records the head as read, for save to compare with. A
// volume whose layer its cache already holds has ended (a crash came
// between the commit's head and the removal of its record): the
// transaction sees no volume, and its save removes the record.
func (t *txn) recordRead() (err error) {
	if t.Volume != nil && t.Volume.landedIn(t.Head) {
		t.Volume = nil
	}
	t.savedHead, err = encodeOrNil(t.Head)
	return err
}

func unlockUnless(l *flock.Lock, keep bool) {
	if keep {
		l.Unlock()
		return
	}
	l.RemoveAndUnlock()
}

// save writes what changed since the last read or save: the head first,
// then the volume, so that a commit lands before its volume goes. A
// closure calls it itself when a later step needs the change durable.
func (t *txn) save() error {
	h, err := encodeOrNil(t.Head)
	if err != nil {
		return err
	}
	if !bytes.Equal(h, t.savedHead) {
		if err := t.saveHead(); err != nil {
			return err
		}
		t.savedHead = h
	}
	v, err := encodeOrNil(t.Volume)
	if err != nil {
		return err
	}
	if !bytes.Equal(v, t.savedVolume) {
		if err := t.saveVolume(); err != nil {
			return err
		}
		t.savedVolume = v
	}
	return nil
}

func (t *txn) saveHead() error {
	if t.Head == nil {
		return t.s.removeCacheFiles(t.cache)
	}
	if err := t.s.writeHead(t.Head); err != nil {
		return fmt.Errorf("write head of cache %s: %w", t.cache, err)
	}
	return nil
}

// saveVolume writes or removes the volume's record. Rewriting an existing
// record may use the space reserve: repairing a volume (a remount that
// finds it torn) must work on a full disk, creating one not.
func (t *txn) saveVolume() error {
	if t.Volume == nil {
		return t.s.removeVolumeDir(t.volID)
	}
	write := func() error { return ondisk.WriteJSONAtomic(t.s.volumePath(t.volID), t.Volume) }
	if plain := write; t.savedVolume != nil {
		write = func() error { return t.s.withReserve(plain) }
	}
	if err := write(); err != nil {
		return fmt.Errorf("write record of volume %q: %w", t.volID, err)
	}
	return nil
}

// encodeOrNil is v as JSON, nil for a nil pointer.
func encodeOrNil[T any](v *T) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	return b, nil
}

// lockedHead reads a cache's head under its lock; ErrNotFound if the
// cache does not exist.
func (s *Store) lockedHead(ctx context.Context, cache CacheRef) (h *head, err error) {
	err = s.transact(ctx, scope{cache: cache}, func(t *txn) error {
		if t.Head == nil {
			return ErrNotFound // callers name the cache
		}
		h = t.Head
		return nil
	})
	return h, err
}
