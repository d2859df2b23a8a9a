package volumes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
)

// csiSockets are where the driver listens and where the kubelet finds it.
type csiSockets struct {
	// Endpoint serves CSI; the kubelet dials it at this same path.
	Endpoint string
	// Registration serves the kubelet's plugin registration: the kubelet
	// watches its plugins_registry directory for new sockets.
	Registration string
}

func csiSocketsIn(kubeletDir string) csiSockets {
	return csiSockets{
		Endpoint:     filepath.Join(kubeletDir, "plugins", v1alpha1.CSIDriverName, "csi.sock"),
		Registration: filepath.Join(kubeletDir, "plugins_registry", v1alpha1.CSIDriverName+"-reg.sock"),
	}
}

// serveCSI serves the driver and registers it with the kubelet until ctx
// ends. The registration service is served in-process rather than by the
// node-driver-registrar sidecar: it is two small calls, and one process
// means the kubelet sees the driver exactly while the agent that owns the
// volumes runs, with no second image to build, ship and keep in step.
func serveCSI(ctx context.Context, d *csiDriver, sockets csiSockets) error {
	logger := log.FromContext(ctx).WithName("csi")
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(log.IntoContext(ctx, logger), req)
		if err != nil {
			logger.Info("CSI call failed", "method", info.FullMethod, "code", status.Code(err).String(), "err", err.Error())
		}
		return resp, err
	}))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterNodeServer(srv, d)
	reg := grpc.NewServer()
	registerapi.RegisterRegistrationServer(reg, &kubeletRegistration{endpoint: sockets.Endpoint, logger: logger})

	errs := make(chan error, 2)
	for _, s := range []struct {
		srv  *grpc.Server
		path string
	}{{srv, sockets.Endpoint}, {reg, sockets.Registration}} {
		l, err := listenUnix(s.path)
		if err != nil {
			srv.Stop()
			reg.Stop()
			return err
		}
		go func() { errs <- s.srv.Serve(l) }()
	}
	logger.Info("Serving CSI inline volumes", "driver", v1alpha1.CSIDriverName, "endpoint", sockets.Endpoint, "registration", sockets.Registration)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	// The registration socket goes first: the kubelet then forgets the
	// driver until the next agent registers it again.
	reg.Stop()
	srv.GracefulStop()
	_ = os.Remove(sockets.Registration)
	_ = os.Remove(sockets.Endpoint)
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve CSI: %w", err)
	}
	return nil
}

// listenUnix listens on a Unix socket at path, replacing one a killed
// agent left behind.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}

// kubeletRegistration answers the kubelet's plugin watcher.
type kubeletRegistration struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
	logger   logr.Logger
}

func (r *kubeletRegistration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type: registerapi.CSIPlugin, Name: v1alpha1.CSIDriverName, Endpoint: r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *kubeletRegistration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		r.logger.Info("The kubelet registered the CSI driver")
	} else {
		r.logger.Info("The kubelet refused the CSI driver", "err", s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
