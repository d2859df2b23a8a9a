// Package lazyfs serves layer images to the kernel before their bytes are
// on the node: a FUSE file system of read-only files, one per image, whose
// reads come from an Image (package layerfs/lazy fills one on demand from
// the registry). The kernel cannot mount EROFS file-backed from a FUSE
// file ("file-backed mounts cannot be applied to stacked fses"), so a
// layer's image is mounted through a read-only loop device over its file
// here (Mount); once the image is complete on local disk, the device
// switches to that file (Settle) and reads no longer pass through user
// space. The kernel's EROFS still does all filesystem work.
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

// Serve mounts a lazyfs at dir, which must exist, and serves it until
// Close. Only root reads it: the files are the images of every tenant's
// layers, and only the store's loop devices open them.
func Serve(dir string, log logr.Logger) (*Server, error) {
	s := &Server{dir: dir, log: log, images: map[string]*imageNode{}}
	root := &fs.Inode{}
	srv, err := fs.Mount(dir, root, &fs.Options{
		MountOptions: fuse.MountOptions{
			// No fusermount: the agent runs as root and mounts directly.
			DirectMount: true, DirectMountStrict: true,
			FsName: "layercache", Name: "lazyfs",
			Options:      []string{"ro", "default_permissions"},
			MaxReadAhead: 1 << 20,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mount lazyfs at %s (the kernel needs FUSE: modprobe fuse, and the agent /dev/fuse): %w", dir, err)
	}
	s.fuse, s.root = srv, root
	return s, nil
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

// Remove stops serving image name: a device that still reads it gets
// errors, so remove an image only once its device reads the local copy
// (Settle) or is gone.
func (s *Server) Remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.images[name]; !ok {
		return
	}
	delete(s.images, name)
	s.root.RmChild(name)
	// The kernel may still cache the entry; tell it to forget.
	_ = s.root.NotifyEntry(name)
}

// Close unmounts the file system. Devices over its files then read
// errors: settle or unmount them first.
func (s *Server) Close() error {
	if err := s.fuse.Unmount(); err != nil {
		return fmt.Errorf("unmount lazyfs at %s: %w", s.dir, err)
	}
	return nil
}

// fuseConnections is where the kernel's fusectl lists FUSE connections.
const fuseConnections = "/sys/fs/fuse/connections"

// Detach ends the file system while loop devices still hold its files
// (which keep a plain unmount busy): it detaches the mount and aborts
// the FUSE connection, as the kernel does when the serving process dies.
// Reads of its files fail from then on; the devices over them stay until
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
// the kernel read its lazyfs for a layer's mount (a loop device's first
// reads) cannot end by itself: its exit releases the loop device, which
// waits for that read, which waits for the FUSE server the exit already
// stopped; only an abort fails the read. The connection is found in the
// mount table, not by a stat, which that lazyfs would never answer.
// Call it only where no live process serves dir.
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
	img Image
	log logr.Logger
}

var (
	_ fs.NodeGetattrer = (*imageNode)(nil)
	_ fs.NodeOpener    = (*imageNode)(nil)
	_ fs.NodeReader    = (*imageNode)(nil)
)

func (n *imageNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o400
	out.Size = uint64(n.img.Size())
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
	got, err := n.img.ReadAt(ctx, dest, off)
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
	return n.img.Size(), true
}
