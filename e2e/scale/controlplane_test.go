//go:build scale

package scale

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/layercache/layercache/internal/envtestassets"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
)

// controlPlane is one run's etcd and kube-apiserver, with an admin client
// and a kubeconfig file for the processes the run starts.
type controlPlane struct {
	cfg        *rest.Config
	c          client.Client
	scheme     *runtime.Scheme
	kubeconfig string
	http       *http.Client
}

// startControlPlane starts etcd and kube-apiserver on free loopback ports
// with the CRDs of crdDir and the layercache StorageClass, and stops them
// when the test ends.
func startControlPlane(t *testing.T, crdDir string) *controlPlane {
	t.Helper()
	assets, err := envtestassets.Dir("test-scale")
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{crdDir},
		ErrorIfCRDPathMissing: true,
	}
	// Thousands of objects: the default client limits (QPS 5) would make
	// setting them up take an hour.
	env.ControlPlane.GetAPIServer().Configure().Set("max-requests-inflight", "800").Set("max-mutating-requests-inflight", "400")
	cfg, err := env.Start()
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping kube-apiserver and etcd: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd from %s: %v", assets, err)
	}
	cfg.QPS, cfg.Burst = 2000, 4000
	scheme, err := bootstrap.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("creating the admin client: %v", err)
	}
	// A kubeconfig for the processes: an admin user of the same API server.
	user, err := env.AddUser(envtest.User{Name: "scale-admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		t.Fatalf("adding the admin user: %v", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatalf("writing the admin kubeconfig: %v", err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.StorageClassName},
		Provisioner: v1alpha1.ProvisionerName, VolumeBindingMode: &wffc}
	if err := c.Create(ctx, sc); err != nil {
		t.Fatalf("creating StorageClass %s: %v", sc.Name, err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatalf("creating the admin HTTP client: %v", err)
	}
	return &controlPlane{cfg: cfg, c: c, scheme: scheme, kubeconfig: kubeconfig, http: hc}
}

// get returns the body of a GET of path (an object as JSON, managedFields
// included, which is its stored size near enough: custom resources are
// stored as JSON; or the API server's /metrics).
func (cp *controlPlane) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cp.cfg.Host, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := cp.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading the body: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return b, nil
}

// freeAddress returns a loopback address with a port that was free a
// moment ago, for a process's metrics or health endpoint.
func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// repoRoot is the module's root: the test runs in e2e/scale.
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("%s is not the module root (no go.mod): run the test from e2e/scale", root)
	}
	return root
}

// mib is bytes in MiB.
func mib(b int64) float64 { return float64(b) / (1 << 20) }

// kib is bytes in KiB.
func kib(b int) float64 { return float64(b) / 1024 }
