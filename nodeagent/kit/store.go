package kit

import (
	"context"
	"io"

	"github.com/layercache/layercache/layerfs"
)

// Store is the part of *layerfs.Store the agent uses.
type Store interface {
	Mount(ctx context.Context, volumeID string, opts layerfs.MountOptions) (*layerfs.Volume, error)
	Commit(ctx context.Context, volumeID string) (layerfs.CommitResult, error)
	Discard(ctx context.Context, volumeID string) error
	End(ctx context.Context, volumeID string, opts layerfs.EndOptions) (layerfs.EndResult, error)
	Volume(ctx context.Context, volumeID string) (*layerfs.Volume, error)
	Volumes(ctx context.Context) ([]layerfs.Volume, error)
	Squash(ctx context.Context, cache layerfs.CacheRef, maxLayers int) (layerfs.SquashResult, error)
	GC(ctx context.Context, opts layerfs.GCOptions) (layerfs.GCResult, error)
	Remove(ctx context.Context, cache layerfs.CacheRef) error
	RemoveIfUnused(ctx context.Context, cache layerfs.CacheRef) (bool, error)
	List(ctx context.Context) ([]layerfs.CacheInfo, error)
	Inspect(ctx context.Context, cache layerfs.CacheRef) (layerfs.CacheInfo, error)
	Recover(ctx context.Context) (layerfs.RecoverResult, error)
	ExportLayer(ctx context.Context, cache layerfs.CacheRef, layerID string, w io.Writer) error
	SetLayerDigest(ctx context.Context, cache layerfs.CacheRef, layerID, digest string) error
	Sync(ctx context.Context, cache layerfs.CacheRef, chain layerfs.Chain, fetch layerfs.Fetch, opts layerfs.SyncOptions) (layerfs.SyncResult, error)
	ResumeLazy(ctx context.Context, open layerfs.OpenLazy) error
	LazyStats() layerfs.LazyStats
}
