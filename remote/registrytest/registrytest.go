// Package registrytest runs go-containerregistry's in-process registry
// behind TLS and basic auth, as real registries are deployed, for tests of
// the packages that push to and pull from one. The e2e suite runs the real
// distribution registry instead.
package registrytest

import (
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// The registry's only account.
const (
	User     = "ci"
	Password = "s3cret"
)

// Registry is a running registry.
type Registry struct {
	server *httptest.Server
	// Host is HOST:PORT, as repositories name it.
	Host string
	// CA is the PEM certificate its TLS certificate chains to.
	CA []byte

	down    atomic.Bool
	corrupt atomic.Bool
	delay   atomic.Int64
	// Requests counts the requests it served, refused ones included.
	Requests atomic.Int64
}

// New starts a registry that stops when the test ends.
func New(t testing.TB) *Registry {
	t.Helper()
	r := &Registry{}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.serve(inner, w, req)
	}))
	t.Cleanup(r.server.Close)
	r.Host = strings.TrimPrefix(r.server.URL, "https://")
	r.CA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.server.Certificate().Raw})
	return r
}

func (r *Registry) serve(inner http.Handler, w http.ResponseWriter, req *http.Request) {
	r.Requests.Add(1)
	if d := time.Duration(r.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-req.Context().Done():
			return
		}
	}
	if r.down.Load() {
		http.Error(w, "registry is down for the test", http.StatusServiceUnavailable)
		return
	}
	u, p, ok := req.BasicAuth()
	if !ok || u != User || p != Password {
		w.Header().Set("WWW-Authenticate", `Basic realm="registrytest"`)
		http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
		return
	}
	if r.corrupt.Load() && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
		fmt.Fprint(w, "not the blob you asked for")
		return
	}
	inner.ServeHTTP(w, req)
}

// SetDown makes every request fail with 503 (an outage), or ends it.
func (r *Registry) SetDown(down bool) { r.down.Store(down) }

// SetDelay makes every request wait d before it is served (a slow or
// overloaded registry).
func (r *Registry) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// SetCorrupt makes blob downloads return the wrong bytes.
func (r *Registry) SetCorrupt(corrupt bool) { r.corrupt.Store(corrupt) }

// DockerConfig is a docker config.json with user and password for the
// registry, keyed as docker login writes it.
func (r *Registry) DockerConfig(user, password string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	return []byte(fmt.Sprintf(`{"auths":{"https://%s":{"auth":%q}}}`, r.Host, auth))
}
