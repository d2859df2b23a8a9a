// Package lazyfs serves layer images to the kernel before their bytes are
// on the node: a FUSE file system of read-only files, one per image, whose
// reads come from an Image (package layerfs/lazy fills one on demand from
// the registry). The kernel's EROFS mounts a layer's image file-backed
// from its file here (MountImage) and does all filesystem work. Once the
// image is complete on local disk, its file here reads that image
// (Settle) for the mounts made so far, and the store mounts the image
// itself for the mounts to come.
//
// The package knows neither the registry nor the store's records: the
// store names the images and the layer directories.
package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Image is an image's bytes by range; a read may wait for bytes that are
// not here yet, and fails once they cannot come.
type Image interface {
	Size() int64
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
}

// Server is a mounted lazyfs: its directory holds one file per image
// added.
type Server struct {
	dir  string
	fuse *fuse.Server
	root *fs.Inode
	log  logr.Logger

	mu     sync.Mutex
	images map[string]*imageNode
}

// imagesNeverChange is how long the kernel keeps an image's attributes
// and name: an image's size and bytes never change, and Remove tells the
// kernel to forget the name. With no timeout the kernel asked for the
// attributes before every read, a round trip through this process.
var imagesNeverChange = time.Hour

// readBytes is the largest read the kernel asks of an image, and how far
// it reads ahead: a build reads a layer's files in the image's order, and
// each request is a round trip through this process (and, with a sidecar,
// the agent's), so a few large ones beat many of the default 128 KiB.
const readBytes = 1 << 20

// Serve mounts a lazyfs at dir, which must exist, and serves it until
// Close. Only root reads it: the files are the images of every tenant's
// layers, and only the store's EROFS mounts open them.
func Serve(dir string, log logr.Logger) (*Server, error) {
	s := &Server{dir: dir, log: log, images: map[string]*imageNode{}}
	root := &fs.Inode{}
	srv, err := fs.Mount(dir, root, &fs.Options{
		EntryTimeout: &imagesNeverChange, AttrTimeout: &imagesNeverChange,
		MountOptions: fuse.MountOptions{
			// No fusermount: the agent runs as root and mounts directly.
			DirectMount: true, DirectMountStrict: true,
			FsName: "layercache", Name: "lazyfs",
			Options:      []string{"ro", "default_permissions"},
			MaxReadAhead: readBytes, MaxWrite: readBytes,
			// A reply of readBytes does not fit a pipe of the default
			// maximum size (fs.pipe-max-size, 1 MiB): no splice, one
			// writev, which copies the bytes once as a splice would.
			DisableSplice: true,
			// A FUSE mount that offers passthrough counts as a stacked
			// file system, and the kernel's EROFS refuses file-backed
			// mounts over stacked ones: it needed a loop device in
			// between, whose hop per read made a fresh node's build
			// read its files at a third of the speed (BenchmarkLazyBuild).
			DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mount lazyfs at %s (the kernel needs FUSE: modprobe fuse, and the agent /dev/fuse): %w", dir, err)
	}
	s.fuse, s.root = srv, root
	if err := setReadAhead(dir, readBytes); err != nil {
		// Reads still work, in requests of 128 KiB.
		log.Error(err, "Raise the lazyfs read-ahead; reads of layers fetched on demand take more round trips")
	}
	return s, nil
}

// setReadAhead sets how far the kernel reads ahead in the files of the
// file system at dir: FUSE takes the server's value only up to the
// kernel's default of 128 KiB, and the device's sysfs entry raises it.
func setReadAhead(dir string, bytes int) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte(strconv.Itoa(bytes>>10)), 0); err != nil {
		return fmt.Errorf("set %s: %w", p, err)
	}
	return nil
}

// Path is where image name's file is.
func (s *Server) Path(name string) string { return s.dir + "/" + name }

// Add serves img as the file name; adding a name again replaces nothing
// and fails.
func (s *Server) Add(name string, img Image) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.images[name]; ok {
		return fmt.Errorf("lazyfs: image %s is served already", name)
	}
	n := &imageNode{img: img, log: s.log.WithValues("image", name)}
	child := s.root.NewPersistentInode(context.Background(), n, fs.StableAttr{Mode: syscall.S_IFREG})
	if !s.root.AddChild(name, child, false) {
		return fmt.Errorf("lazyfs: image %s is served already", name)
	}
	s.images[name] = n
	return nil
}

// Settle serves image name from the complete image at path from now on:
// the mounts over its file read the local image, through this process
// but with no fetch (and, in a sidecar, with no agent), until they go.
func (s *Server) Settle(name, path string) error {
	s.mu.Lock()
	n, ok := s.images[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("lazyfs: settle image %s: it is not served", name)
	}
	local, err := OpenLocal(path, n.image().Size())
	if err != nil {
		return fmt.Errorf("lazyfs: settle image %s: %w", name, err)
	}
	if old, ok := n.swap(local).(*LocalImage); ok {
		old.Close() // settled before: the same image
	}
	return nil
}

// Remove stops serving image name: a mount that still reads it gets
// errors, so remove an image only once the mounts over it are gone.
func (s *Server) Remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.images[name]
	if !ok {
		return
	}
	delete(s.images, name)
	if local, ok := n.image().(*LocalImage); ok {
		local.Close()
	}
	s.root.RmChild(name)
	// The kernel may still cache the entry; tell it to forget.
	_ = s.root.NotifyEntry(name)
}

// Close unmounts the file system. Mounts over its files then read
// errors: unmount them first.
func (s *Server) Close() error {
	if err := s.fuse.Unmount(); err != nil {
		return fmt.Errorf("unmount lazyfs at %s: %w", s.dir, err)
	}
	return nil
}

// fuseConnections is where the kernel's fusectl lists FUSE connections.
const fuseConnections = "/sys/fs/fuse/connections"

// Detach ends the file system while EROFS mounts still hold its files
// (which keep a plain unmount busy): it detaches the mount and aborts
// the FUSE connection, as the kernel does when the serving process dies.
// Reads of its files fail from then on; the mounts over them stay until
// their layers are unmounted.
func (s *Server) Detach() error {
	var st unix.Stat_t
	if err := unix.Stat(s.dir, &st); err != nil {
		return fmt.Errorf("detach lazyfs at %s: %w", s.dir, err)
	}
	if err := unix.Unmount(s.dir, unix.MNT_DETACH); errors.Is(err, unix.EINVAL) {
		s.fuse.Wait() // unmounted already: the kernel ended the connection
		return nil
	} else if err != nil {
		return fmt.Errorf("detach lazyfs at %s: %w", s.dir, err)
	}
	if err := abortConnection(unix.Minor(st.Dev)); err != nil {
		// The process's exit ends the connection all the same.
		s.log.Error(err, "Abort the lazyfs FUSE connection; it ends with this process")
		return nil
	}
	waited := make(chan struct{})
	go func() { s.fuse.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		s.log.Info("The lazyfs FUSE server did not stop within 5s of its abort; it ends with this process")
	}
	return nil
}

// fsType is a lazyfs's type in the mount table.
const fsType = "fuse.lazyfs"

// DetachEnded detaches the lazyfs mounted at dir by a process that ended,
// or is ending, and aborts its FUSE connection. A process killed while
// the kernel read its lazyfs for a layer's mount (EROFS's first reads of
// the file) cannot end by itself: its exit waits for that read, which
// waits for the FUSE server the exit already stopped; only an abort
// fails the read. The connection is found in the mount table, not by a
// stat, which that lazyfs would never answer. Call it only where no
// live process serves dir.
func DetachEnded(dir string) error {
	mounts, err := mountinfo.GetMounts(MountsAt(dir))
	if err != nil {
		return fmt.Errorf("read the mounts at %s: %w", dir, err)
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- { // the table lists stacked mounts in mount order
		m := mounts[i]
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("detach %s at %s: %w", m.FSType, dir, err))
			break
		}
		if m.FSType == fsType {
			errs = append(errs, abortConnection(uint32(m.Minor)))
		}
	}
	return errors.Join(errs...)
}

// fusectlMagic is fusectl's file system type (statfs f_type).
const fusectlMagic = 0x65735543

// abortConnection aborts FUSE connection minor through fusectl, mounting
// it first where nothing did. A connection that is gone already (the
// detach ended the last use of the file system) needs nothing.
func abortConnection(minor uint32) error {
	var st unix.Statfs_t
	if err := unix.Statfs(fuseConnections, &st); err != nil || st.Type != fusectlMagic {
		if err := unix.Mount("fusectl", fuseConnections, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("mount fusectl at %s: %w", fuseConnections, err)
		}
	}
	err := os.WriteFile(fmt.Sprintf("%s/%d/abort", fuseConnections, minor), []byte("1"), 0o200)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("abort FUSE connection %d: %w", minor, err)
	}
	return nil
}

// imageNode is one image's file.
type imageNode struct {
	fs.Inode
	log logr.Logger

	// mu is held by each read while it reads img, and by Settle while it
	// swaps img: once swapped, no read uses the image before, which its
	// owner may close then.
	mu  sync.RWMutex
	img Image
}

func (n *imageNode) image() Image {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.img
}

// swap serves img from now on, once the reads under way have ended, and
// returns the image before.
func (n *imageNode) swap(img Image) Image {
	n.mu.Lock()
	defer n.mu.Unlock()
	old := n.img
	n.img = img
	return old
}

var (
	_ fs.NodeGetattrer = (*imageNode)(nil)
	_ fs.NodeOpener    = (*imageNode)(nil)
	_ fs.NodeReader    = (*imageNode)(nil)
)

func (n *imageNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o400
	out.Size = uint64(n.image().Size())
	out.Blocks = (out.Size + 511) / 512
	return 0
}

// Open allows reads only; the page cache keeps what was read across
// opens, as the image never changes.
func (n *imageNode) Open(_ context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

// Read waits for the bytes; one that cannot come is an I/O error for the
// reader (the image said why, and the store reports it).
func (n *imageNode) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n.mu.RLock()
	got, err := n.img.ReadAt(ctx, dest, off)
	n.mu.RUnlock()
	if err != nil && !errors.Is(err, io.EOF) {
		// At V(1): a build may read failing bytes many times, and the
		// store reports each layer's first failure.
		n.log.V(1).Info("Read of a lazily fetched image failed", "offset", off, "bytes", len(dest), "error", err.Error())
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

// MountsAt selects every mount at dir, stacked ones included (the table
// lists them in mount order); SingleEntryFilter stops at the first.
func MountsAt(dir string) mountinfo.FilterFunc {
	return func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != dir, false }
}

// Serves tells whether image name is served here.
func (s *Server) Serves(name string) (bool, error) {
	return s.serves(name), nil
}

func (s *Server) serves(name string) bool {
	_, ok := s.sizeOf(name)
	return ok
}

// sizeOf is the size of image name, if it is served here.
func (s *Server) sizeOf(name string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.images[name]
	if !ok {
		return 0, false
	}
	return n.image().Size(), true
}

// LocalImage is a complete image on local disk, as lazyfs reads it.
type LocalImage struct {
	f    *os.File
	size int64
}

// OpenLocal opens the image at path, which must be a regular file of
// size bytes (the image it stands for).
func OpenLocal(path string, size int64) (*LocalImage, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return nil, fmt.Errorf("image path %q is not a clean absolute path", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image: %w", err)
	}
	st, err := f.Stat()
	if err == nil && (!st.Mode().IsRegular() || st.Size() != size) {
		err = fmt.Errorf("%s is a %s of %d bytes, want a regular file of %d", path, st.Mode().Type(), st.Size(), size)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open image: %w", err)
	}
	return &LocalImage{f: f, size: size}, nil
}

func (im *LocalImage) Size() int64 { return im.size }

func (im *LocalImage) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	return im.f.ReadAt(p, off)
}

// Close closes the image's file.
func (im *LocalImage) Close() error { return im.f.Close() }
