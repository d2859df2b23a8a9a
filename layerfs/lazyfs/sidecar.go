package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// A lazyfs served by a sidecar outlives the process that fetches its
// images. A FUSE connection ends with the process that serves it, and
// every mount over its files then reads errors: with the agent
// serving its own lazyfs, an agent that is SIGKILLed or OOM-killed fails
// every build reading a layer still in the registry. So a second process
// (`layercache lazyfs`, a container of its own in the agent's pod, which
// the kubelet does not restart with the agent's) mounts the lazyfs and
// keeps it; for the bytes of each read it asks the agent, which owns the
// registry, the credentials and the copies. While the agent is away, a
// read waits for the next one (SidecarConfig.Wait); past that it fails,
// and the sidecar leaves a marker the next agent turns into failed reads
// of the volumes over the layer.
//
// Two unix sockets, both root's: the sidecar's (Control: the agent adds
// and removes images) and the agent's (Images: the sidecar reads them).

// SidecarConfig is where a sidecar and its agent meet.
type SidecarConfig struct {
	// Dir is the lazyfs mount point.
	Dir string
	// Control is the sidecar's socket.
	Control string
	// Images is the agent's socket.
	Images string
	// Markers is the directory of the markers of reads that failed while
	// no agent answered: <Markers>/<image>.failed-read.
	Markers string
	// Wait is how long a read waits for an agent; 0 means DefaultAgentWait.
	Wait time.Duration
}

// DefaultAgentWait outlasts a container restart and the kubelet's first
// back-offs (10 s, 20 s, 40 s).
const DefaultAgentWait = 2 * time.Minute

// MarkerSuffix ends the name of a failed read's marker.
const MarkerSuffix = ".failed-read"

// Marker is a failed read's marker (JSON).
type Marker struct {
	Error string `json:"error"`
}

func (c SidecarConfig) marker(name string) string {
	return filepath.Join(c.Markers, name+MarkerSuffix)
}

// The RPCs' arguments and replies (net/rpc, gob).
type (
	// AddArgs names an image to serve and its size.
	AddArgs struct {
		Name string
		Size int64
	}
	// SettleArgs names a served image and the complete image on local
	// disk that its file reads from now on.
	SettleArgs struct {
		Name string
		Path string
	}
	// ReadArgs asks for Len bytes of image Name at Off.
	ReadArgs struct {
		Name string
		Off  int64
		Len  int
	}
	// ReadReply is the bytes read; Unknown says the agent does not serve
	// the image (yet), Err why the read failed (the agent has marked the
	// volumes over it).
	ReadReply struct {
		Data    []byte
		EOF     bool
		Unknown bool
		Err     string
	}
)

// Sidecar serves a lazyfs whose images an agent reads.
type Sidecar struct {
	cfg   SidecarConfig
	srv   *Server
	ln    net.Listener
	conns connSet
	agent *rpcDialer
	log   logr.Logger
}

// ServeSidecar detaches what a sidecar that ended left at cfg.Dir, mounts
// a lazyfs there and listens for its agent at cfg.Control.
func ServeSidecar(cfg SidecarConfig, log logr.Logger) (*Sidecar, error) {
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultAgentWait
	}
	if err := DetachEnded(cfg.Dir); err != nil {
		log.Error(err, "Detach the lazyfs of a sidecar that ended")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create lazyfs mount point: %w", err)
	}
	ln, err := listenUnix(cfg.Control)
	if err != nil {
		return nil, err
	}
	srv, err := Serve(cfg.Dir, log)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Sidecar{cfg: cfg, srv: srv, ln: ln, agent: &rpcDialer{path: cfg.Images}, log: log}
	rs := rpc.NewServer()
	if err := rs.RegisterName("Lazyfs", &sidecarRPC{s}); err != nil {
		ln.Close()
		_ = srv.Close()
		return nil, fmt.Errorf("serve lazyfs control: %w", err)
	}
	go acceptRPC(ln, rs, &s.conns)
	return s, nil
}

// Close stops listening and ends the lazyfs: devices over its files read
// errors from then on.
func (s *Sidecar) Close() error {
	s.ln.Close()
	s.conns.close()
	s.agent.close()
	return s.srv.Detach()
}

// WaitForAgentExit returns once no agent listens, or after at most max.
func (s *Sidecar) WaitForAgentExit(max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		conn, err := net.DialTimeout("unix", s.cfg.Images, time.Second)
		if err != nil {
			return
		}
		conn.Close()
		time.Sleep(agentRetry)
	}
}

// sidecarRPC is what the agent calls.
type sidecarRPC struct{ s *Sidecar }

// Add serves image a.Name, read from the agent; an image served already
// (the agent restarted) is kept.
func (r *sidecarRPC) Add(a AddArgs, _ *struct{}) error {
	if a.Name == "" || a.Name == "." || a.Name == ".." || filepath.Base(a.Name) != a.Name {
		return fmt.Errorf("lazyfs image name %q is not a file name", a.Name)
	}
	if size, ok := r.s.srv.sizeOf(a.Name); ok {
		if size != a.Size {
			return fmt.Errorf("lazyfs image %s is served with %d bytes, not %d", a.Name, size, a.Size)
		}
		return nil
	}
	return r.s.srv.Add(a.Name, &agentImage{s: r.s, name: a.Name, size: a.Size})
}

// Settle serves image a.Name from the local image a.Path from now on,
// with no agent: the mounts made over its file so far outlive the agent.
func (r *sidecarRPC) Settle(a SettleArgs, _ *struct{}) error {
	return r.s.srv.Settle(a.Name, a.Path)
}

// Remove stops serving image name.
func (r *sidecarRPC) Remove(name string, _ *struct{}) error {
	r.s.srv.Remove(name)
	return nil
}

// Serves tells whether image name is served.
func (r *sidecarRPC) Serves(name string, served *bool) error {
	*served = r.s.srv.serves(name)
	return nil
}

// agentImage is an image whose bytes the agent reads.
type agentImage struct {
	s    *Sidecar
	name string
	size int64
}

func (im *agentImage) Size() int64 { return im.size }

// agentRetry is the pause between asks while no agent answers.
const agentRetry = 250 * time.Millisecond

// ReadAt asks the agent, waiting for one that answers and serves the
// image; past the wait the read fails and a marker says so.
func (im *agentImage) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	deadline := time.Now().Add(im.s.cfg.Wait)
	var last error
	for {
		var reply ReadReply
		err := im.s.agent.call(ctx, "Images.ReadAt", ReadArgs{Name: im.name, Off: off, Len: len(p)}, &reply)
		switch {
		case err == nil && reply.Err != "":
			return 0, errors.New(reply.Err)
		case err == nil && !reply.Unknown:
			n := copy(p, reply.Data)
			if reply.EOF {
				return n, io.EOF
			}
			return n, nil
		case err == nil:
			last = fmt.Errorf("the node agent does not serve image %s", im.name)
		default:
			last = err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if time.Now().After(deadline) {
			return 0, im.giveUp(last)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(agentRetry):
		}
	}
}

// giveUp leaves the marker of a read that failed while no agent served
// the image, so that the next agent discards the volumes over it.
func (im *agentImage) giveUp(last error) error {
	err := fmt.Errorf("no node agent served image %s within %s: %w", im.name, im.s.cfg.Wait, last)
	if werr := ondisk.WriteJSONAtomic(im.s.cfg.marker(im.name), Marker{Error: err.Error()}); werr != nil {
		im.s.log.Error(werr, "Record a failed read of a lazily fetched image; the volumes over it may be committed", "image", im.name)
	}
	im.s.log.Error(err, "A read of a lazily fetched image failed while no node agent answered", "image", im.name)
	return err
}

// rpcDialer keeps one connection to a unix socket's RPC server, dialled
// again after it breaks.
type rpcDialer struct {
	path string
	mu   sync.Mutex
	c    *rpc.Client
}

func (d *rpcDialer) client() (*rpc.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c != nil {
		return d.c, nil
	}
	conn, err := net.DialTimeout("unix", d.path, 5*time.Second)
	if err != nil {
		return nil, err
	}
	d.c = rpc.NewClient(conn)
	return d.c, nil
}

// call makes one call, dropping the connection when it broke.
func (d *rpcDialer) call(ctx context.Context, method string, args, reply any) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	done := c.Go(method, args, reply, make(chan *rpc.Call, 1)).Done
	select {
	case call := <-done:
		var se rpc.ServerError
		if call.Error != nil && !errors.As(call.Error, &se) {
			d.drop(c)
		}
		return call.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *rpcDialer) drop(c *rpc.Client) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c == c {
		d.c.Close()
		d.c = nil
	}
}

func (d *rpcDialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c != nil {
		d.c.Close()
		d.c = nil
	}
}

// acceptRPC serves each connection ln accepts until it is closed,
// tracking them in conns.
func acceptRPC(ln net.Listener, rs *rpc.Server, conns *connSet) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		if !conns.add(conn) {
			conn.Close()
			return
		}
		go rs.ServeConn(conn)
	}
}

// connSet is the connections a server accepted, closed together.
type connSet struct {
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func (c *connSet) add(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conns = append(c.conns, conn)
	return !c.closed
}

func (c *connSet) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

// maxSocketPath is the longest path a unix socket's address holds.
const maxSocketPath = 107

// listenUnix listens at path, root's only, replacing the socket of a
// process that ended.
func listenUnix(path string) (net.Listener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is %d bytes, over the %d a unix socket takes: use a shorter --root", path, len(path), maxSocketPath)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create the directory of socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove the socket %s of a process that ended: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen at %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("make socket %s root's: %w", path, err)
	}
	return ln, nil
}
