package layerfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/erofs"
	"github.com/layercache/layercache/layerfs/lazy"
	"github.com/layercache/layercache/layerfs/lazyfs"
	"github.com/layercache/layercache/layerfs/loop"
	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/receive"
)

// Mount first: a chain layer that can be read by range (ChainLayer.Lazy)
// is mounted at once when Sync is given an OpenLazy. Its image is a sparse
// local copy (layerfs/lazy) under partial/<id>, which reads fill on
// demand; the store's lazyfs (FUSE, at <root>/lazyfs) serves that copy as
// a file, and the kernel's EROFS mounts that file at layers/<id>, where
// every other part of the store finds a layer. A goroutine completes the
// copy in the background; once it is whole and matches the layer's diff
// ID, it is settled: written to images/<id>, the lazyfs file read from
// that image (no fetch, no agent) for the volumes mounted so far, and the
// image mounted file-backed over the layer directory for the volumes
// mounted from then on, whose reads leave user space. What was partial
// is recorded in partial/<id>.json, so that a restarted agent serves it
// again (ResumeLazy) and the sweep removes it with its layer.
//
// A read that cannot be served (the registry is away for longer than the
// layer's wait, or sends corrupt bytes) fails with EIO. Before the build
// sees the error, every volume over the layer is marked (failedReadFile):
// End discards a marked volume instead of committing what a build wrote
// while it read errors.

// defaultLazyWait is how long a lazily mounted layer's read waits for the
// registry when the sync sets no wait.
const defaultLazyWait = 30 * time.Second

// lazyRetry is the pause between background completions of a copy whose
// registry was away.
const lazyRetry = 5 * time.Second

// ErrLazyNotServed is returned (wrapped) for a volume over a layer whose
// bytes are still partly in the registry while nothing serves them (the
// agent has not resumed them since it started, or could not): an overlay
// over its empty mount point would show a cache without that layer.
var ErrLazyNotServed = errors.New("layer is fetched on demand but nothing serves it")

// LazyStats are what the store's lazily mounted layers fetched and what
// their reads waited for, since the store was opened.
type LazyStats struct {
	OnDemandBytes    int64   // fetched for reads
	BackgroundBytes  int64   // fetched to complete copies
	ReadStalls       int64   // reads that waited for a fetch
	ReadStallSeconds float64 // the time they waited, in all
	FailedReads      int64   // reads that failed (EIO)
	CompletedLayers  int64   // copies completed and settled
	CompleteSeconds  float64 // from mount to settle, summed over them
	Filling          int     // layers served now, still partial
}

// partialRecord is partial/<id>.json: what a partial layer is a copy of.
type partialRecord struct {
	Cache     CacheRef      `json:"cache"`
	Digest    string        `json:"digest"`
	DiffID    string        `json:"diffID"`
	Index     string        `json:"index"`
	Size      int64         `json:"size"`
	IndexSize int64         `json:"indexSize"`
	Wait      time.Duration `json:"wait"`
}

func (r partialRecord) chainLayer() ChainLayer {
	return ChainLayer{Digest: r.Digest, Size: r.Size, Format: FormatEROFS, DiffID: r.DiffID, Index: r.Index, IndexSize: r.IndexSize}
}

// lazyServer serves image files to the store's EROFS mounts: a
// *lazyfs.Server in this process or a *lazyfs.Remote through a sidecar.
type lazyServer interface {
	Path(name string) string
	Add(name string, img lazyfs.Image) error
	// Settle serves image name from the complete image at path from now
	// on; the reads under way end first.
	Settle(name, path string) error
	Remove(name string)
	// Serves tells whether image name is served (by the sidecar, for the
	// process before this one, or since this one added it).
	Serves(name string) (bool, error)
	// Detach ends this process's part; mounts over the files of an
	// in-process lazyfs read errors from then on.
	Detach() error
}

// lazyLayers are the layers this process serves.
type lazyLayers struct {
	log logr.Logger

	mu     sync.Mutex
	server lazyServer
	served map[string]*lazyLayer
	// busy are the partial layers a Sync or a resume is setting up: the
	// other must not take them for a dead process's (their record is
	// written, and their mount made, before they are served).
	busy    map[string]bool
	closed  bool
	settled LazyStats // of copies no longer served
	wg      sync.WaitGroup
}

// lazyLayer is one served partial layer.
type lazyLayer struct {
	id      string
	rec     partialRecord
	file    *lazy.File
	started time.Time
	cancel  context.CancelFunc
	// recordReads stores the layer's prefetch list once it is complete.
	recordReads func(ctx context.Context, chunks []int) error

	failMu   sync.Mutex
	reported bool
}

func (s *Store) partialDir() string                 { return filepath.Join(s.root, "partial") }
func (s *Store) partialCopy(id string) string       { return filepath.Join(s.partialDir(), id) }
func (s *Store) partialRecordPath(id string) string { return s.partialCopy(id) + ".json" }
func (s *Store) lazyfsDir() string                  { return filepath.Join(s.root, "lazyfs") }

// LazyfsSidecar is where the sidecar that serves the lazyfs of the store
// at root and the store's process meet (Options.LazyfsSidecar). Their
// sockets are not in root/run, the node agent's mount gate: the agent
// mounts a tmpfs there at its first start after a boot, and a sidecar
// that had listened there first (both containers start together) was
// unreachable under it for good, so every lazy pull of the node failed
// (a CI rehearsal, Nov 2026).
func LazyfsSidecar(root string) lazyfs.SidecarConfig {
	sockets := filepath.Join(root, "sockets")
	return lazyfs.SidecarConfig{
		Dir:     filepath.Join(root, "lazyfs"),
		Control: filepath.Join(sockets, "lazyfs.sock"),
		Images:  filepath.Join(sockets, "lazyfs-images.sock"),
		Markers: filepath.Join(root, "partial"),
	}
}

// sidecarMarker is where the sidecar marks a failed read of partial
// layer id's image while no agent answered.
func (s *Store) sidecarMarker(id string) string {
	return filepath.Join(s.partialDir(), id+lazyfs.MarkerSuffix)
}

// failedReadFile marks a volume that may have read errors from a lazily
// mounted layer.
func (s *Store) failedReadFile(volumeID string) string {
	return filepath.Join(s.volumeDir(volumeID), "failed-read.json")
}

// pullLazy mounts a chain layer before its bytes are here, as a new layer
// that nothing references yet (the sweep removes it if it never lands in
// a head).
func (s *Store) pullLazy(ctx context.Context, cache CacheRef, cl ChainLayer, opts SyncOptions) (LayerInfo, error) {
	src, err := opts.OpenLazy(ctx, cache, cl)
	if err != nil {
		return LayerInfo{}, fmt.Errorf("open it for reads by range: %w", err)
	}
	if opts.MaxLayerBytes > 0 && src.ImageBytes > opts.MaxLayerBytes {
		return LayerInfo{}, fmt.Errorf("its image is %d bytes, over the bound of %d: %w", src.ImageBytes, opts.MaxLayerBytes, ErrTooLarge)
	}
	wait := opts.LazyWait
	if wait <= 0 {
		wait = defaultLazyWait
	}
	id := randomID()
	s.claimPartial(id)
	defer s.releasePartial(id)
	rec := partialRecord{Cache: cache, Digest: cl.Digest, DiffID: cl.DiffID, Index: cl.Index, Size: cl.Size, IndexSize: cl.IndexSize, Wait: wait}
	if err := ondisk.WriteJSONAtomic(s.partialRecordPath(id), rec); err != nil {
		return LayerInfo{}, fmt.Errorf("record the partial layer: %w", err)
	}
	sb, err := s.serveLazy(ctx, id, rec, src, false)
	if err != nil {
		s.removePartial(id)
		return LayerInfo{}, err
	}
	return LayerInfo{ID: id, Bytes: src.ImageBytes, Files: int64(sb.Inodes), Created: time.Now().UTC(), Digest: cl.Digest}, nil
}

// serveLazy opens partial layer id's copy (keeping what it holds), checks
// the image's metadata through it, and serves and mounts it at its layer
// directory, unless it is mounted there already (over a sidecar's file);
// a goroutine then completes it.
func (s *Store) serveLazy(ctx context.Context, id string, rec partialRecord, src LazySource, mounted bool) (erofs.Superblock, error) {
	f, err := lazy.Open(lazy.Options{
		Path: s.partialCopy(id), Size: src.ImageBytes, ChunkSize: src.ChunkBytes,
		Fetch: src.Fetch, Digest: digest.Digest(rec.DiffID), Wait: rec.Wait, Prefetch: src.Prefetch,
	})
	if err != nil {
		return erofs.Superblock{}, err
	}
	sb, err := checkLazyImage(ctx, f, rec.Digest)
	if err == nil {
		err = s.mountLazy(id, rec, f, src, mounted)
	}
	if err != nil {
		f.Close()
		return sb, err
	}
	return sb, nil
}

// checkLazyImage reads the image's metadata through its copy and checks
// it, as a pull checks a whole image: the kernel must not be the first to
// read a tenant's metadata.
func checkLazyImage(ctx context.Context, f *lazy.File, name string) (erofs.Superblock, error) {
	r := fileAt{ctx: ctx, f: f}
	first := make([]byte, erofs.BlockSize)
	if _, err := r.ReadAt(first, 0); err != nil {
		return erofs.Superblock{}, fmt.Errorf("read the image's first block: %w", err)
	}
	sb, err := erofs.ParseSuperblock(first)
	if err != nil {
		return sb, fmt.Errorf("layer %s is not a layer image: %w: %w", name, ErrInvalidImage, err)
	}
	if sb.ImageBytes() != f.Size() {
		return sb, fmt.Errorf("layer %s: its index says %d bytes, its image's superblock %d: %w", name, f.Size(), sb.ImageBytes(), ErrInvalidImage)
	}
	if err := erofs.Check(r, sb); err != nil {
		return sb, fmt.Errorf("layer %s: %w: %w", name, ErrInvalidImage, err)
	}
	return sb, nil
}

// fileAt is a lazy.File as an io.ReaderAt, for the image check.
type fileAt struct {
	ctx context.Context
	f   *lazy.File
}

func (r fileAt) ReadAt(p []byte, off int64) (int, error) { return r.f.ReadAt(r.ctx, p, off) }

// mountLazy serves f as partial layer id and mounts it at the layer's
// directory (unless mounted), then starts its completion.
func (s *Store) mountLazy(id string, rec partialRecord, f *lazy.File, src LazySource, mounted bool) error {
	srv, err := s.lazyServer()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &lazyLayer{id: id, rec: rec, file: f, started: time.Now(), cancel: cancel}
	if len(src.Prefetch) == 0 {
		l.recordReads = src.RecordReads
	}
	if err := srv.Add(id, layerImage{s: s, l: l}); err != nil {
		cancel()
		return err
	}
	dir := s.layerDir(id)
	if !mounted {
		err = os.Mkdir(dir, 0o700)
		if err == nil || errors.Is(err, os.ErrExist) {
			ondisk.FaultPoint() // the layer's directory exists, nothing is mounted on it
			err = lazyfs.MountImage(srv.Path(id), dir)
		}
	}
	if err != nil {
		cancel()
		srv.Remove(id)
		return fmt.Errorf("mount partial layer %s: %w", id, err)
	}
	s.lazy.mu.Lock()
	s.lazy.served[id] = l
	s.lazy.wg.Add(1)
	s.lazy.mu.Unlock()
	go s.complete(ctx, l)
	return nil
}

// lazyServer returns the store's lazyfs, mounting it on first use (or
// connecting to its sidecar). A lazyfs left by a process that ended is
// detached first.
func (s *Store) lazyServer() (lazyServer, error) {
	s.lazy.mu.Lock()
	defer s.lazy.mu.Unlock()
	if s.lazy.closed {
		return nil, errors.New("the store is closed: it mounts no layer before its bytes are here")
	}
	if s.lazy.server != nil {
		return s.lazy.server, nil
	}
	if s.opts.LazyfsSidecar {
		r, err := lazyfs.ConnectSidecar(LazyfsSidecar(s.root), s.lazy.log)
		if err != nil {
			return nil, err
		}
		s.lazy.server = r
		return r, nil
	}
	dir := s.lazyfsDir()
	if err := lazyfs.DetachEnded(dir); err != nil {
		s.lazy.log.Error(err, "Detach the lazyfs of a process that ended")
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create lazyfs mount point: %w", err)
	}
	srv, err := lazyfs.Serve(dir, s.lazy.log)
	if err != nil {
		return nil, err
	}
	s.lazy.server = srv
	return srv, nil
}

// detachEndedLazyfs detaches the lazyfs of a process that ended, unless
// this one serves it: a dead FUSE mount fails every stat of it (ENOTCONN),
// and tools that walk the mount table, such as mkfs.btrfs, fail with it;
// a process stuck in its exit on that lazyfs ends once its connection is
// aborted (lazyfs.DetachEnded).
func (s *Store) detachEndedLazyfs() {
	s.lazy.mu.Lock()
	defer s.lazy.mu.Unlock()
	if s.lazy.server == nil && !s.lazy.closed && !s.opts.LazyfsSidecar { // a sidecar's lives on
		if err := lazyfs.DetachEnded(s.lazyfsDir()); err != nil {
			s.lazy.log.Error(err, "Detach the lazyfs of a process that ended")
		}
	}
}

// currentLazyServer is the store's lazyfs if it has one yet.
func (s *Store) currentLazyServer() lazyServer {
	s.lazy.mu.Lock()
	defer s.lazy.mu.Unlock()
	return s.lazy.server
}

// detachStale detaches whatever is mounted at dir (a dead FUSE mount of a
// process that ended, whose files nothing can read again).
func detachStale(dir string) {
	for range 8 {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return
		}
	}
}

// layerImage is a served layer's image as lazyfs reads it: a read that
// fails marks the volumes over the layer before the build sees EIO.
type layerImage struct {
	s *Store
	l *lazyLayer
}

func (im layerImage) Size() int64 { return im.l.file.Size() }

func (im layerImage) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	n, err := im.l.file.ReadAt(ctx, p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		im.s.readFailed(im.l, err)
	}
	return n, err
}

// readFailed marks every volume over l as having read errors, and
// reports l's first failure.
func (s *Store) readFailed(l *lazyLayer, cause error) {
	s.lazy.mu.Lock()
	s.lazy.settled.FailedReads++
	s.lazy.mu.Unlock()
	if err := s.markVolumesOver(l.id, cause.Error()); err != nil {
		s.lazy.log.Error(err, "Mark the volumes over a layer whose read failed", "layer", l.id)
	}
	l.failMu.Lock()
	first := !l.reported
	l.reported = true
	l.failMu.Unlock()
	if !first {
		return
	}
	s.lazy.log.Error(cause, "A read of a layer mounted before its bytes were here failed; the volumes over it are discarded at their end", "cache", l.rec.Cache.String(), "layer", l.id, "digest", l.rec.Digest)
	if s.opts.OnLazyReadFailed != nil {
		s.opts.OnLazyReadFailed(l.rec.Cache, l.rec.Digest, cause)
	}
}

// failedRead is what failedReadFile records.
type failedRead struct {
	Layer string `json:"layer"`
	Error string `json:"error"`
}

// markVolumesOver marks every volume whose lower layers include layer.
func (s *Store) markVolumesOver(layer, why string) error {
	recs, err := s.volumeRecords()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		if !slices.Contains(r.Layers, layer) || ondisk.Exists(s.failedReadFile(r.ID)) {
			continue
		}
		err := ondisk.WriteJSONAtomic(s.failedReadFile(r.ID), failedRead{Layer: layer, Error: why})
		if err != nil && !errors.Is(err, os.ErrNotExist) { // a volume that just ended
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sawFailedRead tells why volume r may have read errors, or "": its
// marker, or one its sidecar left on a layer under it that no agent has
// taken yet.
func (s *Store) sawFailedRead(r *volumeRecord) string {
	for _, id := range r.Layers {
		var m lazyfs.Marker
		if err := readJSON(s.sidecarMarker(id), &m); !errors.Is(err, ErrNotFound) {
			return fmt.Sprintf("a read of layer %s, fetched on demand, failed while no node agent answered: %s", id, m.Error)
		}
		if lost, err := s.lostBySidecar(id); err != nil || lost {
			return fmt.Sprintf("layer %s, fetched on demand, was no longer served by the lazyfs sidecar (restarted, or away: %v)", id, err)
		}
	}
	for _, id := range r.LazyLayers {
		if lost, err := s.lazyfsLost(id); err != nil || lost {
			return fmt.Sprintf("layer %s, fetched on demand, was read through a lazyfs that no longer serves it (the process that served it ended: %v)", id, err)
		}
	}
	var fr failedRead
	if err := readJSON(s.failedReadFile(r.ID), &fr); errors.Is(err, ErrNotFound) {
		return ""
	} else if err != nil {
		return "a read of a layer fetched on demand failed"
	}
	return fmt.Sprintf("a read of layer %s, fetched on demand, failed: %s", fr.Layer, fr.Error)
}

// complete fills l's copy in the background and settles it, retrying
// while the registry is away; a corrupt copy is never settled (its reads
// keep failing) and is reported.
func (s *Store) complete(ctx context.Context, l *lazyLayer) {
	defer s.lazy.wg.Done()
	for attempt := 0; ; attempt++ {
		err := l.file.Fill(ctx)
		if err == nil {
			err = s.settle(ctx, l)
			if err == nil || ctx.Err() != nil {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, lazy.ErrCorrupt) {
			s.lazy.log.Error(err, "A layer fetched on demand is corrupt in the registry; it is never completed", "cache", l.rec.Cache.String(), "layer", l.id, "digest", l.rec.Digest)
			return
		}
		if attempt == 0 {
			s.lazy.log.Info("Completing a layer fetched on demand failed; retrying", "cache", l.rec.Cache.String(), "layer", l.id, "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(lazyRetry):
		}
	}
}

// settle makes complete layer l an image like a pulled one, under the
// shared store lock (the sweep, which takes it exclusively, cannot
// remove l meanwhile).
func (s *Store) settle(ctx context.Context, l *lazyLayer) error {
	lock, err := s.lockStore(ctx, false)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	s.lazy.mu.Lock()
	srv, served := s.lazy.server, s.lazy.served[l.id] == l
	s.lazy.mu.Unlock()
	if !served {
		return nil // the sweep dropped it
	}
	if lost, err := s.lostBySidecar(l.id); err != nil {
		return err
	} else if lost { // the volumes over it read errors since
		if err := s.markVolumesOver(l.id, "the lazyfs sidecar that served the layer restarted while it was mounted"); err != nil {
			return err
		}
	}
	// A settle that failed after the image was written is retried: the
	// copy is the image already. RenameDurable has the fault points of the
	// rename; after it, the lazyfs file still reads the copy.
	if !s.images().Has(l.id) {
		if err := s.writeSettled(ctx, l.id); err != nil {
			return fmt.Errorf("settle layer %s: %w", l.id, err)
		}
	}
	if err := srv.Settle(l.id, s.images().Path(l.id)); err != nil {
		return fmt.Errorf("settle layer %s: %w", l.id, err)
	}
	ondisk.FaultPoint() // the lazyfs file reads the image; no file-backed mount over it yet
	if err := s.images().MountOver(l.id); err != nil {
		s.lazy.log.Error(err, "Mount a settled layer's image file-backed; volumes keep reading it through the lazyfs", "layer", l.id)
	}
	ondisk.FaultPoint() // settled and mounted, its partial record not yet removed
	s.recordReads(l)
	// Closed first, so that its last record of progress is written before
	// the files go; no longer served only once they are gone, so that a
	// store that serves no partial layer (LazyStats.Filling) has none.
	l.file.Close()
	s.removePartial(l.id)
	s.forget(l)
	s.lazy.mu.Lock()
	s.lazy.settled.CompletedLayers++
	s.lazy.settled.CompleteSeconds += time.Since(l.started).Seconds()
	s.lazy.mu.Unlock()
	s.lazy.log.Info("Settled a layer fetched on demand", "cache", l.rec.Cache.String(), "layer", l.id, "took", time.Since(l.started).Round(time.Millisecond).String())
	if s.opts.OnLazyComplete != nil {
		s.opts.OnLazyComplete(l.rec.Cache)
	}
	return nil
}

// recordTimeout bounds the store of a prefetch list.
const recordTimeout = 30 * time.Second

// recordReads stores, in the background, the order in which the reads
// of settled layer l touched its chunks, if its source takes one: the
// first build on the next fresh node will find them fetched first.
func (s *Store) recordReads(l *lazyLayer) {
	order := l.file.ReadOrder()
	if l.recordReads == nil || len(order) == 0 {
		return
	}
	s.lazy.wg.Add(1)
	go func() {
		defer s.lazy.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
		defer cancel()
		if err := l.recordReads(ctx, order); err != nil {
			s.lazy.log.Error(err, "Store the prefetch list of a layer fetched on demand; the next fresh node fetches it in order", "cache", l.rec.Cache.String(), "layer", l.id, "digest", l.rec.Digest)
			return
		}
		s.lazy.log.V(1).Info("Stored the prefetch list of a layer fetched on demand", "cache", l.rec.Cache.String(), "layer", l.id, "chunks", len(order))
	}()
}

// writeSettled writes the complete copy of partial layer id again, in
// order, as the layer's image. The copy was written in the order its
// chunks came (reads first, then four fetches at a time, synced every
// 64 MiB), which leaves it in many extents on disk: 41 to 47 against a
// pulled image's 6 at 512 MiB, and a settled layer read 0.43x to 0.68x
// as fast as a pulled one (BenchmarkLazyBuild). Holes stay holes; the
// temp file is one Recover removes.
func (s *Store) writeSettled(ctx context.Context, id string) error {
	src, err := os.Open(s.partialCopy(id))
	if err != nil {
		return fmt.Errorf("open its copy: %w", err)
	}
	defer src.Close()
	tmp := filepath.Join(s.partialDir(), "."+id+".tmp-settle")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the image a settle left: %w", err)
	}
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write its image: %w", err)
	}
	sw := receive.NewSparseWriter(dst, 0)
	_, err = io.CopyBuffer(sw, receive.WithContext(ctx, src), make([]byte, 1<<20))
	if err == nil {
		err = sw.Finish()
	}
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = ondisk.RenameDurable(tmp, s.images().Path(id))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write its image: %w", err)
	}
	return nil
}

// forget stops serving l in this process, keeping what it fetched in the
// totals; a sidecar still serves its file (the caller removes it there).
// Its completion must be done or cancelled.
func (s *Store) forget(l *lazyLayer) {
	s.lazy.mu.Lock()
	served := s.lazy.served[l.id] == l
	delete(s.lazy.served, l.id)
	s.lazy.mu.Unlock()
	if !served {
		return
	}
	l.file.Close()
	st := l.file.Stats()
	s.lazy.mu.Lock()
	s.lazy.settled.OnDemandBytes += st.OnDemandBytes
	s.lazy.settled.BackgroundBytes += st.BackgroundBytes
	s.lazy.settled.ReadStalls += st.Stalls
	s.lazy.settled.ReadStallSeconds += st.StallSeconds
	s.lazy.mu.Unlock()
}

// removePartial removes partial layer id's files, its record last: a
// record without its copy or state is resumed (the copy starts over), or
// finished if the image exists.
func (s *Store) removePartial(id string) {
	if err := s.takeSidecarMarker(id); err != nil {
		s.lazy.log.Error(err, "Mark the volumes over a layer whose read failed while no agent answered", "layer", id)
	}
	for _, p := range []string{s.partialCopy(id), s.partialCopy(id) + ".state"} {
		if os.Remove(p) == nil { // a fault point after each removal
			ondisk.FaultPoint()
		}
	}
	os.Remove(s.partialRecordPath(id))
	ondisk.SyncDir(s.partialDir())
}

// LazyStats returns what the layers mounted before their bytes were here
// fetched, and how their reads fared.
func (s *Store) LazyStats() LazyStats {
	s.lazy.mu.Lock()
	defer s.lazy.mu.Unlock()
	st := s.lazy.settled
	for _, l := range s.lazy.served {
		fs := l.file.Stats()
		st.OnDemandBytes += fs.OnDemandBytes
		st.BackgroundBytes += fs.BackgroundBytes
		st.ReadStalls += fs.Stalls
		st.ReadStallSeconds += fs.StallSeconds
		st.Filling++
	}
	return st
}

// partialIDs lists the layers recorded as partial.
func (s *Store) partialIDs() ([]string, error) {
	entries, err := os.ReadDir(s.partialDir())
	if err != nil {
		return nil, fmt.Errorf("list partial layers: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// lazilyRead are the layers of ids that an overlay mounted now reads
// through their lazyfs files: those with a partial record, which goes
// only once the image's own mount is stacked over the layer's.
func (s *Store) lazilyRead(ids []string) []string {
	var lazy []string
	for _, id := range ids {
		if ondisk.Exists(s.partialRecordPath(id)) {
			lazy = append(lazy, id)
		}
	}
	return lazy
}

// lazyfsLost tells whether the lazyfs file of layer id, which a volume
// mounted while it was partial reads, is no longer served: the process
// that served it (the agent, or its sidecar) ended since, and reads of it
// fail. A settled layer's file is served for as long as that process
// lives, and nothing serves it again.
func (s *Store) lazyfsLost(id string) (bool, error) {
	srv, err := s.servingLazyfs()
	if err != nil {
		return true, err
	}
	if srv == nil { // this process serves nothing: the one that did ended
		return true, nil
	}
	served, err := srv.Serves(id)
	return !served, err
}

// servingLazyfs is the lazyfs that serves the node's lazyfs files now:
// this process's, its sidecar (which may serve files of the agent before
// this one), or none.
func (s *Store) servingLazyfs() (lazyServer, error) {
	if srv := s.currentLazyServer(); srv != nil || !s.opts.LazyfsSidecar {
		return srv, nil
	}
	return s.lazyServer()
}

// isPartial tells whether layer id is still partly in the registry.
func (s *Store) isPartial(id string) bool {
	return ondisk.Exists(s.partialRecordPath(id)) && !s.images().Has(id)
}

// readyLayers makes the layers ids ready for an overlay: images mounted,
// and partial layers served by this process.
func (s *Store) readyLayers(ids []string) error {
	if err := s.images().Ready(ids); err != nil {
		return err
	}
	for _, id := range ids {
		if !s.isPartial(id) {
			continue
		}
		s.lazy.mu.Lock()
		_, served := s.lazy.served[id]
		s.lazy.mu.Unlock()
		if !served {
			return fmt.Errorf("layer %s: %w (the node agent serves it again once it has started; a store opened by the layerfs CLI cannot)", id, ErrLazyNotServed)
		}
		if lost, err := s.lostBySidecar(id); err != nil || lost {
			return fmt.Errorf("layer %s: %w: the lazyfs sidecar does not serve it (restarted, or away: %v); the node agent serves it again at its next pass", id, ErrLazyNotServed, err)
		}
	}
	return nil
}

// ResumeLazy serves again the partial layers that a process that ended
// served (an agent restarted, or a node rebooted), keeping what their
// copies hold: open reopens each layer by range (the caller checks that
// its chain still trusts it). A layer still mounted over the ended
// process's file cannot be read again through that mount: the volumes
// over it are marked (their builds may have read errors), the mount is
// detached, and the layer is mounted afresh for the volumes to come. A
// layer that cannot be opened stays unserved (readyLayers refuses volumes
// over it) and is named in the error; call ResumeLazy again later.
func (s *Store) ResumeLazy(ctx context.Context, open OpenLazy) error {
	s.detachEndedLazyfs()
	s.dropLostBySidecar()
	lock, err := s.lockStore(ctx, false)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	ids, err := s.partialIDs()
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		errs = append(errs, s.resumeLayer(ctx, id, open))
	}
	return errors.Join(errs...)
}

func (s *Store) resumeLayer(ctx context.Context, id string, open OpenLazy) error {
	if !s.claimPartial(id) {
		return nil // served, or being set up by a Sync
	}
	defer s.releasePartial(id)
	if s.images().Has(id) { // settled, then the process ended before the record went
		// The record goes only once the image is mounted: a failed mount
		// is tried again at the next resume.
		if err := s.mountSettled(id); err != nil {
			return fmt.Errorf("resume settled layer %s: %w", id, err)
		}
		s.removePartial(id)
		return nil
	}
	var rec partialRecord
	if err := readJSON(s.partialRecordPath(id), &rec); err != nil {
		return fmt.Errorf("resume partial layer %s: %w", id, err)
	}
	src, err := open(ctx, rec.Cache, rec.chainLayer())
	if err != nil {
		return fmt.Errorf("resume partial layer %s of cache %s: %w", id, rec.Cache, err)
	}
	mounted, err := s.liveLazyMount(id)
	if err != nil {
		return fmt.Errorf("resume partial layer %s: %w", id, err)
	}
	if _, err := s.serveLazy(ctx, id, rec, src, mounted); err != nil {
		return fmt.Errorf("resume partial layer %s of cache %s: %w", id, rec.Cache, err)
	}
	return nil
}

// liveLazyMount tells whether partial layer id's mount, if any, still
// reads its image: a sidecar served it while no agent did (its volumes
// read on; those that read errors meanwhile are marked). A mount over the
// lazyfs of a process that ended reads errors only: the volumes over it
// are marked, and it is detached.
func (s *Store) liveLazyMount(id string) (bool, error) {
	dir := s.layerDir(id)
	if !ondisk.IsMountPoint(dir) {
		return false, s.takeSidecarMarker(id)
	}
	srv, err := s.lazyServer()
	if err != nil {
		return false, err
	}
	if served, err := srv.Serves(id); err != nil {
		return false, err
	} else if served {
		return true, s.takeSidecarMarker(id)
	}
	if err := s.markVolumesOver(id, "the process that served the layer ended while it was mounted"); err != nil {
		return false, err
	}
	detachStale(dir)
	return false, s.takeSidecarMarker(id)
}

// lostBySidecar tells whether layer id, served by this process, is no
// longer served by the sidecar: it restarted, which ended the mounts over
// its files (their reads fail until the layer is served and mounted
// again). Not in sidecar mode, or not served here: false.
func (s *Store) lostBySidecar(id string) (bool, error) {
	if !s.opts.LazyfsSidecar {
		return false, nil
	}
	s.lazy.mu.Lock()
	_, here := s.lazy.served[id]
	s.lazy.mu.Unlock()
	srv := s.currentLazyServer()
	if !here || srv == nil {
		return false, nil
	}
	served, err := srv.Serves(id)
	return !served, err
}

// dropLostBySidecar stops serving, here, the layers the sidecar lost, so
// that the resume that follows marks the volumes over them and serves and
// mounts them again.
func (s *Store) dropLostBySidecar() {
	s.lazy.mu.Lock()
	served := make([]*lazyLayer, 0, len(s.lazy.served))
	for _, l := range s.lazy.served {
		served = append(served, l)
	}
	s.lazy.mu.Unlock()
	for _, l := range served {
		lost, err := s.lostBySidecar(l.id)
		if err != nil {
			s.lazy.log.Error(err, "Check that the lazyfs sidecar still serves a layer", "layer", l.id)
			continue
		}
		if lost {
			s.lazy.log.Info("The lazyfs sidecar lost a layer (it restarted): the volumes over it are discarded at their end, and it is served again", "cache", l.rec.Cache.String(), "layer", l.id)
			l.cancel()
			s.forget(l)
		}
	}
}

// takeSidecarMarker marks the volumes over partial layer id if a read of
// it failed while no agent answered its sidecar, then drops the marker.
func (s *Store) takeSidecarMarker(id string) error {
	var m lazyfs.Marker
	if err := readJSON(s.sidecarMarker(id), &m); errors.Is(err, ErrNotFound) {
		return nil
	} else if err != nil {
		m.Error = fmt.Sprintf("a read failed while no node agent answered (its record is unreadable: %v)", err)
	}
	if err := s.markVolumesOver(id, m.Error); err != nil {
		return err
	}
	if err := os.Remove(s.sidecarMarker(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the failed-read marker of layer %s: %w", id, err)
	}
	return nil
}

// claimPartial marks partial layer id as being set up by the caller,
// unless it is served or being set up already.
func (s *Store) claimPartial(id string) bool {
	s.lazy.mu.Lock()
	defer s.lazy.mu.Unlock()
	if _, ok := s.lazy.served[id]; ok || s.lazy.busy[id] {
		return false
	}
	s.lazy.busy[id] = true
	return true
}

func (s *Store) releasePartial(id string) {
	s.lazy.mu.Lock()
	defer s.lazy.mu.Unlock()
	delete(s.lazy.busy, id)
}

// mountSettled mounts the image of layer id, whose settle a process that
// ended began, at the layer's directory, as settle would have: what that
// process left mounted there depends on where it ended. A mount over a
// sidecar's file that still serves the layer goes on, reading the image
// from then on; over a lazyfs that is gone it reads errors only: the
// volumes over the layer are marked and the mount is detached. The image
// is mounted file-backed over the layer directory for the volumes to
// come. (A loop device switched to the image is what agents before
// file-backed lazy mounts left.)
func (s *Store) mountSettled(id string) error {
	dir, img := s.layerDir(id), s.images().Path(id)
	mounts, err := mountinfo.GetMounts(lazyfs.MountsAt(dir))
	if err != nil {
		return fmt.Errorf("read the mounts at %s: %w", dir, err)
	}
	if len(mounts) == 0 {
		return s.images().Mount(id)
	}
	top := mounts[len(mounts)-1] // the table lists stacked mounts in mount order
	if top.Source == img {
		return nil
	}
	if file, err := loop.BackingFile(top.Source); err == nil && file == img {
		return s.images().MountOver(id)
	}
	if settled, err := s.settleOverSidecar(id, top.Source); err != nil || settled {
		return err
	}
	if err := s.markVolumesOver(id, "the process that served the layer ended while it was mounted"); err != nil {
		return err
	}
	detachStale(dir)
	return s.images().Mount(id)
}

// settleOverSidecar settles layer id, mounted from source, in a sidecar
// whose file that is and that still serves it (the volumes over it read
// on), as settle would have: the file reads the layer's image from then
// on, which is mounted over it for the volumes to come.
func (s *Store) settleOverSidecar(id, source string) (bool, error) {
	if !s.opts.LazyfsSidecar {
		return false, nil
	}
	srv, err := s.lazyServer()
	if err != nil {
		return false, err
	}
	if source != srv.Path(id) {
		return false, nil
	}
	if served, err := srv.Serves(id); err != nil || !served {
		return false, err
	}
	if err := srv.Settle(id, s.images().Path(id)); err != nil {
		return false, err
	}
	return true, s.images().MountOver(id)
}

// lazilyMounted tells whether layer id's directory dir has a mount over
// its lazyfs file: a partial layer's, or a settled one's that served the
// volumes mounted before its settle (under its image's mount).
func (s *Store) lazilyMounted(dir, id string) bool {
	file := filepath.Join(s.lazyfsDir(), id)
	mounts, err := mountinfo.GetMounts(lazyfs.MountsAt(dir))
	return err == nil && slices.ContainsFunc(mounts, func(m *mountinfo.Info) bool { return m.Source == file })
}

// stopServing stops serving the image of layer id, whose mounts are gone;
// a sidecar serves a settled layer's image by itself, whichever agent
// settled it.
func (s *Store) stopServing(id string) {
	srv, err := s.servingLazyfs()
	if err != nil {
		s.lazy.log.Error(err, "Stop serving the image of a removed layer; the lazyfs sidecar keeps it open until it restarts", "layer", id)
		return
	}
	if srv != nil {
		srv.Remove(id)
	}
}

// dropPartials stops serving the partial layers that refs lacks and moves
// their files into tmp/ (the sweep, under the exclusive store lock, after
// their mounts are gone).
func (s *Store) dropPartials(refs map[string]bool) ([]string, error) {
	ids, err := s.partialIDs()
	if err != nil {
		return nil, err
	}
	var trash []string
	for _, id := range ids {
		if refs[id] {
			continue
		}
		s.lazy.mu.Lock()
		l := s.lazy.served[id]
		s.lazy.mu.Unlock()
		if l != nil {
			l.cancel()
			s.forget(l)
		}
		if srv := s.currentLazyServer(); srv != nil {
			srv.Remove(id)
		}
		for _, name := range []string{id, id + ".state", id + lazyfs.MarkerSuffix, id + ".json"} {
			src := filepath.Join(s.partialDir(), name)
			if !ondisk.Exists(src) {
				continue
			}
			dst := filepath.Join(s.tmpDir(), "trash-partial-"+name)
			if err := os.Rename(src, dst); err != nil {
				return trash, fmt.Errorf("move unreferenced partial layer %s aside: %w", id, err)
			}
			trash = append(trash, dst)
		}
	}
	return trash, nil
}

// Close stops the background completions and unmounts the store's
// lazyfs. Layers it served stay mounted over its files, which read
// errors from then on: the next process's ResumeLazy serves them again.
// A closed store mounts no layer lazily.
func (s *Store) Close() error {
	s.lazy.mu.Lock()
	s.lazy.closed = true
	served := make([]*lazyLayer, 0, len(s.lazy.served))
	for _, l := range s.lazy.served {
		served = append(served, l)
	}
	s.lazy.mu.Unlock()
	for _, l := range served {
		l.cancel()
	}
	s.lazy.wg.Wait()
	for _, l := range served {
		s.forget(l)
	}
	s.lazy.mu.Lock()
	srv := s.lazy.server
	s.lazy.server = nil
	s.lazy.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Detach()
}
