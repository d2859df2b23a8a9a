package layerfs

import (
	"context"
	"fmt"
	"io"

	"github.com/layercache/layercache/layerfs/erofs"
)

// ExportLayer writes layer layerID of cache (it must be in the cache's
// head; ErrNotFound otherwise) to w as an EROFS image (layerfs/erofs)
// that a receiving node mounts as the layer: whiteouts, opaque dirs,
// sockets, sparse files and files named .wh.* are carried as they are,
// with nothing to translate. Deterministic: the same layer always gives
// the same bytes (the caller may push it twice and needs the same
// digest). Holds the store lock shared so GC cannot remove the layer
// meanwhile.
//
// A layer the image cannot carry fails with ErrUnpublishable and names
// the path; a failure to write to w does not (it may be a full disk).
func (s *Store) ExportLayer(ctx context.Context, cache CacheRef, layerID string, w io.Writer) error {
	if err := cache.Validate(); err != nil {
		return err
	}
	storeLock, err := s.lockStore(ctx, false)
	if err != nil {
		return err
	}
	defer storeLock.Unlock()
	h, err := s.checkInHead(ctx, cache, layerID)
	if err != nil {
		return err
	}
	dir, err := s.layoutOf(h.Layout).exportDir(ctx, layerID)
	if err != nil {
		return fmt.Errorf("export layer %s of cache %s: %w", layerID, cache, err)
	}
	ew := &errWriter{w: w}
	_, err = erofs.Write(ctx, dir, ew)
	switch {
	case err == nil:
		return nil
	case ew.err != nil || ctx.Err() != nil:
		return fmt.Errorf("export layer %s of cache %s: %w", layerID, cache, err)
	default:
		return fmt.Errorf("export layer %s of cache %s: %w: %w", layerID, cache, ErrUnpublishable, err)
	}
}

// errWriter remembers whether a write failed, to tell the destination's
// failures from the layer's.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// checkInHead returns cache's head, or ErrNotFound unless layerID is in it.
// The caller holds the store lock, which keeps the layer from being swept
// after the cache lock is released.
func (s *Store) checkInHead(ctx context.Context, cache CacheRef, layerID string) (*head, error) {
	h, err := s.lockedHead(ctx, cache)
	if err != nil {
		return nil, fmt.Errorf("export layer %s: cache %s: %w", layerID, cache, err)
	}
	if !h.hasLayer(layerID) {
		return nil, fmt.Errorf("export layer %s: it is not in cache %s (squashed or synced away): %w", layerID, cache, ErrNotFound)
	}
	return h, nil
}
