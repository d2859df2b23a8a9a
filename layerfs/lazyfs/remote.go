package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Remote is the agent's side of a sidecar's lazyfs: it serves the bytes
// of the images it adds there.
type Remote struct {
	cfg     SidecarConfig
	ln      net.Listener
	conns   connSet
	sidecar *rpcDialer
	log     logr.Logger

	mu     sync.Mutex
	images map[string]Image
}

// ConnectSidecar listens for the sidecar's reads at cfg.Images; the
// sidecar itself is called when an image is added.
func ConnectSidecar(cfg SidecarConfig, log logr.Logger) (*Remote, error) {
	ln, err := listenUnix(cfg.Images)
	if err != nil {
		return nil, err
	}
	r := &Remote{cfg: cfg, ln: ln, sidecar: &rpcDialer{path: cfg.Control}, log: log, images: map[string]Image{}}
	rs := rpc.NewServer()
	if err := rs.RegisterName("Images", &imagesRPC{r}); err != nil {
		ln.Close()
		return nil, fmt.Errorf("serve lazyfs images: %w", err)
	}
	go acceptRPC(ln, rs, &r.conns)
	return r, nil
}

// Path is where image name's file is.
func (r *Remote) Path(name string) string { return r.cfg.Dir + "/" + name }

// sidecarWait bounds how long the agent waits for its sidecar to answer
// (both containers start together).
const sidecarWait = 30 * time.Second

// Add serves img as the file name of the sidecar's lazyfs; one the
// sidecar serves already (for the agent before this one) reads img from
// now on.
func (r *Remote) Add(name string, img Image) error {
	r.mu.Lock()
	r.images[name] = img
	r.mu.Unlock()
	err := r.callSidecar("Lazyfs.Add", AddArgs{Name: name, Size: img.Size()}, &struct{}{})
	if err != nil {
		r.mu.Lock()
		delete(r.images, name)
		r.mu.Unlock()
		return fmt.Errorf("serve image %s through the lazyfs sidecar: %w", name, err)
	}
	return nil
}

// Settle makes the sidecar read image name from the complete image at
// path, with no agent, from now on: this agent no longer serves it.
func (r *Remote) Settle(name, path string) error {
	if err := r.callSidecar("Lazyfs.Settle", SettleArgs{Name: name, Path: path}, &struct{}{}); err != nil {
		return fmt.Errorf("settle image %s in the lazyfs sidecar: %w", name, err)
	}
	r.mu.Lock()
	delete(r.images, name)
	r.mu.Unlock()
	return nil
}

// Remove stops serving image name.
func (r *Remote) Remove(name string) {
	r.mu.Lock()
	delete(r.images, name)
	r.mu.Unlock()
	if err := r.callSidecar("Lazyfs.Remove", name, &struct{}{}); err != nil {
		r.log.Error(err, "Stop serving an image through the lazyfs sidecar; it reads errors once this agent forgot it", "image", name)
	}
}

// Serves tells whether the sidecar serves image name: mounts over it
// outlived the agent before this one, and, for an image this agent added,
// the sidecar has not restarted since (which ended their mounts).
func (r *Remote) Serves(name string) (bool, error) {
	var served bool
	if err := r.callSidecar("Lazyfs.Serves", name, &served); err != nil {
		return false, fmt.Errorf("ask the lazyfs sidecar whether it serves image %s: %w", name, err)
	}
	return served, nil
}

// Detach stops answering the sidecar's reads, as this process's end
// does; the sidecar keeps its lazyfs, whose reads wait for the next
// agent.
func (r *Remote) Detach() error {
	r.ln.Close()
	r.conns.close()
	r.sidecar.close()
	return nil
}

// callSidecar calls the sidecar, waiting for one that listens.
func (r *Remote) callSidecar(method string, args, reply any) error {
	ctx, cancel := context.WithTimeout(context.Background(), sidecarWait)
	defer cancel()
	for {
		err := r.sidecar.call(ctx, method, args, reply)
		var se rpc.ServerError
		if err == nil || errors.As(err, &se) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no lazyfs sidecar answered at %s within %s (is its container running?): %w", r.cfg.Control, sidecarWait, err)
		case <-time.After(agentRetry):
		}
	}
}

// imagesRPC is what the sidecar calls.
type imagesRPC struct{ r *Remote }

// maxRead bounds a read's bytes (the kernel asks at most max_read, 128 KiB
// to 1 MiB).
const maxRead = 4 << 20

// ReadAt reads an image; a failure is the reply's, not the call's.
func (rpcs *imagesRPC) ReadAt(a ReadArgs, reply *ReadReply) error {
	if a.Len < 0 || a.Len > maxRead || a.Off < 0 {
		return fmt.Errorf("read of %d bytes at %d: out of bounds", a.Len, a.Off)
	}
	rpcs.r.mu.Lock()
	img, ok := rpcs.r.images[a.Name]
	rpcs.r.mu.Unlock()
	if !ok {
		reply.Unknown = true
		return nil
	}
	buf := make([]byte, a.Len)
	n, err := img.ReadAt(context.Background(), buf, a.Off)
	reply.Data = buf[:n]
	switch {
	case errors.Is(err, io.EOF):
		reply.EOF = true
	case err != nil:
		reply.Err = err.Error()
	}
	return nil
}
