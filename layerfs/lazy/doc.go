// Package lazy is a layer image's local copy that fills on demand and in
// the background, so that a node can mount a published layer before its
// bytes are here (issue 35).
//
// A File is a sparse local copy of a remote EROFS image, divided into
// fixed chunks. A read of a range whose chunks are missing fetches them at
// once (a Fetch: the caller's range request on the registry blob, with its
// decompression) and then reads the copy; Fill fetches the rest in the
// background, the chunks that the previous node's first build read
// (Prefetch) first. Each chunk is fetched once, whoever asks: a read of a
// chunk that Fill is fetching waits for that fetch. Chunk digests, when
// given, are checked before a chunk's bytes count, and the whole image's
// digest before the copy counts as complete.
//
// Progress is kept beside the copy (Path+".state"), written as every
// durable step of layerfs is (ondisk: temp file, fsync, rename): a chunk is
// recorded only after its bytes are fsynced in the copy, in batches, so a
// crash loses at most the chunks of the last batch, which are fetched
// again, and a recorded chunk is never wrong.
//
// The FUSE server that serves the copy to the kernel's EROFS and the
// store that decides which layers to mount lazily call this package; it
// knows neither, nor the registry client (Fetch is a function).
package lazy
