package layerfs

// Temporary bodies so that other packages compile while the store lands.

import (
	"context"
	"errors"
)

var errPending = errors.New("layerfs: operation pending implementation")

// Store is a layered cache store rooted at one directory.
type Store struct{ opts Options }

func Open(ctx context.Context, opts Options) (*Store, error) { return &Store{opts: opts}, nil }
func (s *Store) Root() string                                { return s.opts.Root }
func (s *Store) Mount(ctx context.Context, volumeID string, opts MountOptions) (*Volume, error) {
	return nil, errPending
}
func (s *Store) Commit(ctx context.Context, volumeID string) (CommitResult, error) {
	return CommitResult{}, errPending
}
func (s *Store) Discard(ctx context.Context, volumeID string) error           { return errPending }
func (s *Store) Volume(ctx context.Context, volumeID string) (*Volume, error) { return nil, errPending }
func (s *Store) Volumes(ctx context.Context) ([]Volume, error)                { return nil, errPending }
func (s *Store) Squash(ctx context.Context, cache CacheRef, maxLayers int) (SquashResult, error) {
	return SquashResult{}, errPending
}
func (s *Store) GC(ctx context.Context, opts GCOptions) (GCResult, error) {
	return GCResult{}, errPending
}
func (s *Store) Remove(ctx context.Context, cache CacheRef) error { return errPending }
func (s *Store) List(ctx context.Context) ([]CacheInfo, error)    { return nil, errPending }
func (s *Store) Inspect(ctx context.Context, cache CacheRef) (CacheInfo, error) {
	return CacheInfo{}, errPending
}
func (s *Store) Recover(ctx context.Context) (RecoverResult, error) {
	return RecoverResult{}, errPending
}

// MountCommand returns the equivalent `mount -t overlay ...` line for a
// volume, for debugging.
func (s *Store) MountCommand(ctx context.Context, volumeID string) (string, error) {
	return "", errPending
}
