// Package remote moves a cache's layers between a node's store and an OCI
// registry, the distributed store of caches that span nodes.
//
// A cache is one repository (<registry>/<namespace>/<cache>). Each layer is
// a blob: the layer's EROFS image (layerfs/erofs, see layerfs.ExportLayer),
// compressed with zstd or gzip. A zstd blob is in the zstd seekable format
// (independent 1 MiB frames and a seek table, seekable.go), which a plain
// zstd decoder reads whole; its Index, a blob of its own, maps each frame
// to its bytes and sha256, so that a node can read the image by range
// (OpenIndex, RangeFetch) before it has all of it. A plain OCI image
// manifest, tagged "latest", lists the chain base-first, so registry
// garbage collection keeps the blobs and crane or skopeo can inspect a
// cache. The chain's order is not the registry's to decide: the Cache
// resource's status is the sequencer (see the node agent).
//
// This package knows nothing of Kubernetes or of the store: it pushes what
// an export function writes and hands out digest-verified streams.
package remote
