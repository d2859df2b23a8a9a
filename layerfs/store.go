package layerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/flock"
	"github.com/layercache/layercache/layerfs/ondisk"
	"github.com/layercache/layercache/layerfs/overlay"
	"github.com/layercache/layercache/layerfs/snapshot"
)

// Store is a layered cache store rooted at one directory.
type Store struct {
	root string
	opts Options
	// snapshots is the btrfs area of the snapshot layout (snapshot.go).
	snapshots *snapshot.Area
	// syncs shares syncfs between concurrent commits.
	syncs ondisk.SyncGroup
	// cacheGates queues this process's waiters for a cache's lock.
	cacheGates flock.Gates
	// lazy are the layers this process serves before their bytes are here
	// (lazymount.go).
	lazy *lazyLayers
}

// Open prepares the store's directories under opts.Root and proves with a
// real test mount that the root can host overlay upper directories. A root
// that can't is refused with a message that says what to fix.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Root == "" {
		return nil, errors.New("store root is empty: pass --root DIR (default " + DefaultRoot + ")")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("store root %q: %w", opts.Root, err)
	}
	// Overlay mount options are comma- and colon-separated lists of paths.
	if strings.ContainsAny(root, ",:\\\n") {
		return nil, fmt.Errorf("store root %q contains ',', ':', '\\' or a newline, which overlay mount options cannot carry; choose another directory", root)
	}
	if opts.MaxLayers <= 0 {
		opts.MaxLayers = DefaultMaxLayers
	}
	if opts.SnapshotImageBytes < 0 {
		return nil, fmt.Errorf("snapshot image size %d is negative: use a number of bytes, or 0 for the default %d", opts.SnapshotImageBytes, int64(DefaultSnapshotImageBytes))
	}
	if opts.MaxLayers >= overlay.MaxDepth {
		return nil, fmt.Errorf("max layers %d is too deep: overlayfs stacks at most %d layers; use a value below that", opts.MaxLayers, overlay.MaxDepth)
	}
	opts.Root = root
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	s := &Store{root: root, opts: opts, lazy: &lazyLayers{log: opts.Log, served: map[string]*lazyLayer{}, busy: map[string]bool{}}}
	s.snapshots = snapshot.New(snapshot.Config{
		Root: root, Tmp: s.tmpDir(), ImageBytes: opts.SnapshotImageBytes, MkfsBtrfs: opts.MkfsBtrfs, Private: ControlDir,
	})
	if err := s.makeDirs(); err != nil {
		return nil, err
	}
	if err := s.probe(ctx); err != nil {
		return nil, fmt.Errorf("store root %s cannot host overlay volumes: %w", root, err)
	}
	// After a reboot the snapshot area's image is no longer mounted;
	// snapshot caches must be there before Recover or a mount needs them.
	// A failure here does not fail Open: overlay caches must not go down
	// with a damaged btrfs image. Every use of a snapshot cache (mount,
	// commit, Recover, the sweep) tries again and reports the error.
	if s.snapshots.Used() {
		_ = s.ensureSnapshotArea(ctx)
	}
	s.refillReserve()
	return s, nil
}

// makeDirs creates the store's directories, root-only. Layer and upper
// directories take the volume root's mode (0777 by default) and their paths
// are public in /proc/*/mountinfo; only 0700 parents keep host users from
// planting files in every cache. Pods are not affected: the kubelet (root)
// bind-mounts a volume's merged directory by path, and access through a
// mount does not look at the parents of its source. Existing stores are
// tightened too.
func (s *Store) makeDirs() error {
	if err := os.MkdirAll(s.root, 0o711); err != nil {
		return fmt.Errorf("create store root: %w", err)
	}
	for _, dir := range []string{s.layersDir(), s.images().Images, s.cachesDir(), s.volumesDir(), s.locksDir(), s.tmpDir(), s.emptyLayer(), s.partialDir()} {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create store directory: %w", err)
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("restrict store directory to root: %w", err)
		}
	}
	return nil
}

// probe runs the overlay probe under the shared store lock, so that a
// Recover in another process does not remove the probe's directory.
//
// The probe needs a little space. On a full disk the store must still open,
// because recover, gc and discard are what free space; so a probe that
// fails for lack of space is accepted if an earlier probe proved the same
// kernel and filesystem (probe.json).
func (s *Store) probe(ctx context.Context) error {
	l, err := s.lockStore(ctx, false)
	if err != nil {
		return err
	}
	defer l.Unlock()
	proof := probeProof{Kernel: kernelRelease(), Filesystem: ondisk.FSTypeName(s.root)}
	err = overlay.Probe(ctx, s.tmpDir())
	var earlier probeProof
	switch {
	case err == nil:
		if readJSON(s.probePath(), &earlier) != nil || earlier != proof {
			ondisk.WriteJSONAtomic(s.probePath(), proof) // best effort
		}
		return nil
	case isNoSpace(err) && readJSON(s.probePath(), &earlier) == nil && earlier == proof:
		return nil
	case isNoSpace(err):
		return fmt.Errorf("%w: no earlier probe proved this kernel and filesystem; free some space under %s and start again", err, s.root)
	}
	return err
}

// probeProof records which kernel and filesystem passed the overlay probe.
type probeProof struct {
	Kernel     string `json:"kernel"`
	Filesystem string `json:"filesystem"`
}

func (s *Store) probePath() string { return filepath.Join(s.root, "probe.json") }

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Root is the store's absolute root directory.
func (s *Store) Root() string { return s.root }

func (s *Store) layersDir() string  { return filepath.Join(s.root, "layers") }
func (s *Store) cachesDir() string  { return filepath.Join(s.root, "caches") }
func (s *Store) volumesDir() string { return filepath.Join(s.root, "volumes") }
func (s *Store) locksDir() string   { return filepath.Join(s.root, "locks") }
func (s *Store) tmpDir() string     { return filepath.Join(s.root, "tmp") }

// emptyLayer is the lower layer of a cache without layers: overlayfs needs
// at least one lower directory.
func (s *Store) emptyLayer() string { return filepath.Join(s.root, "empty") }

func (s *Store) layerDir(id string) string { return filepath.Join(s.layersDir(), id) }
func (s *Store) cacheDir(c CacheRef) string {
	return filepath.Join(s.cachesDir(), c.Namespace, c.Name)
}
func (s *Store) headPath(c CacheRef) string { return filepath.Join(s.cacheDir(c), "head.json") }

// Locks. The store lock is shared by operations that create references to
// layers (mount, commit, squash) and exclusive for the sweep that deletes
// unreferenced layers, so a layer is never deleted between being created or
// chosen and being recorded. Order: store, volume, cache.
func (s *Store) lockStore(ctx context.Context, exclusive bool) (*flock.Lock, error) {
	return flock.Acquire(ctx, filepath.Join(s.locksDir(), "store"), !exclusive)
}

func (s *Store) lockVolume(ctx context.Context, id string) (*flock.Lock, error) {
	return flock.Acquire(ctx, filepath.Join(s.locksDir(), "volume-"+id), false)
}

func (s *Store) lockCache(ctx context.Context, c CacheRef) (*flock.Lock, error) {
	// '_' cannot occur in a DNS-1123 label, so the name is unambiguous.
	return s.cacheGates.Acquire(ctx, filepath.Join(s.locksDir(), "cache-"+c.Namespace+"_"+c.Name))
}

func (s *Store) progress(p Progress) {
	if s.opts.Progress != nil {
		s.opts.Progress(p)
	}
}

// isTemp tells whether a directory entry is a build in progress.
func isTemp(name string) bool { return strings.HasPrefix(name, "new-") || strings.HasPrefix(name, ".") }
