// Package registrytest runs go-containerregistry's in-process registry
// behind TLS and basic auth, as real registries are deployed, for tests of
// the packages that push to and pull from one. The e2e suite runs the real
// distribution registry instead.
package registrytest

import (
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
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

	down          atomic.Bool
	corrupt       atomic.Bool
	refuseMounts  atomic.Bool
	refuseDeletes atomic.Bool
	delay         atomic.Int64
	ignoreRange   atomic.Bool
	flip          atomic.Pointer[flip]
	// Requests counts the requests it served, refused ones included.
	Requests atomic.Int64
	// Deletes counts the manifests it deleted.
	Deletes atomic.Int64

	mu  sync.Mutex
	log []string
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

func (r *Registry) serve(inner http.Handler, rw http.ResponseWriter, req *http.Request) {
	r.Requests.Add(1)
	w := &statusWriter{ResponseWriter: rw, status: http.StatusOK}
	defer func() { r.record(req, w.status) }()
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
	if r.mount(inner, w, req) {
		return
	}
	if req.Method == http.MethodDelete && strings.Contains(req.URL.Path, "/manifests/") {
		r.deleteManifest(inner, w, req)
		return
	}
	if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
		r.serveBlob(inner, w, req)
		return
	}
	inner.ServeHTTP(w, req)
}

// serveBlob serves a blob download with the faults the test set: the
// Range header dropped (the whole blob, 200, as registries and proxies
// that ignore ranges answer) or one byte flipped on the way.
func (r *Registry) serveBlob(inner http.Handler, w http.ResponseWriter, req *http.Request) {
	if r.ignoreRange.Load() {
		req.Header.Del("Range")
	}
	if f := r.flip.Load(); f != nil && strings.HasSuffix(req.URL.Path, "/blobs/"+f.digest) {
		w = &flipWriter{ResponseWriter: w, at: f.at}
	}
	inner.ServeHTTP(w, req)
}

type flip struct {
	digest string
	at     int64
}

// flipWriter flips the blob's byte at, wherever the response starts in
// the blob (a 206's Content-Range says where).
type flipWriter struct {
	http.ResponseWriter
	at, pos int64
}

func (w *flipWriter) WriteHeader(code int) {
	if code == http.StatusPartialContent {
		fmt.Sscanf(w.Header().Get("Content-Range"), "bytes %d-", &w.pos)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *flipWriter) Write(p []byte) (int, error) {
	if i := w.at - w.pos; i >= 0 && i < int64(len(p)) {
		p = append([]byte(nil), p...)
		p[i] ^= 0xff
	}
	w.pos += int64(len(p))
	return w.ResponseWriter.Write(p)
}

// mount answers a cross-repository blob mount (POST
// /v2/<repo>/blobs/uploads/?mount=<digest>&from=<repo>) as the
// distribution registry does: 201 Created if the source repository has
// the blob, else nothing here (the inner registry opens an upload
// session, 202, as a registry that cannot mount does). The inner
// registry keeps blobs by digest alone, so a mounted blob is in every
// repository already; what the mount adds is the answer.
func (r *Registry) mount(inner http.Handler, w http.ResponseWriter, req *http.Request) bool {
	q := req.URL.Query()
	digest, from := q.Get("mount"), q.Get("from")
	repo, ok := strings.CutSuffix(strings.TrimPrefix(req.URL.Path, "/v2/"), "/blobs/uploads/")
	if req.Method != http.MethodPost || !ok || digest == "" || from == "" || r.refuseMounts.Load() {
		return false
	}
	head := httptest.NewRequest(http.MethodHead, "/v2/"+from+"/blobs/"+url.PathEscape(digest), nil)
	rec := httptest.NewRecorder()
	inner.ServeHTTP(rec, head)
	if rec.Code != http.StatusOK {
		return false
	}
	w.Header().Set("Location", "/v2/"+repo+"/blobs/"+digest)
	w.Header().Set("Docker-Content-Digest", digest)
	w.WriteHeader(http.StatusCreated)
	return true
}

// statusWriter remembers the status a request was answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (r *Registry) record(req *http.Request, status int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, fmt.Sprintf("%s %s %d", req.Method, req.URL.RequestURI(), status))
}

// Log lists the requests served so far, as "METHOD URI STATUS" (the
// URI with its query), oldest first, like an access log.
func (r *Registry) Log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

// SetRefuseMounts makes cross-repository blob mounts open an upload
// session (202) instead of mounting (201), as registries that do not
// mount, or do not let these credentials read the source, answer.
func (r *Registry) SetRefuseMounts(refuse bool) { r.refuseMounts.Store(refuse) }

// deleteManifest deletes as the distribution registry does: by digest
// only, and the tags that name the manifest go with it (the in-process
// registry keeps them); with deletes refused, 405 UNSUPPORTED, as
// distribution answers without storage.delete.enabled.
func (r *Registry) deleteManifest(inner http.Handler, w http.ResponseWriter, req *http.Request) {
	repo, ref, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/v2/"), "/manifests/")
	switch {
	case r.refuseDeletes.Load():
		http.Error(w, `{"errors":[{"code":"UNSUPPORTED","message":"The operation is unsupported."}]}`, http.StatusMethodNotAllowed)
		return
	case !strings.HasPrefix(ref, "sha256:"):
		http.Error(w, `{"errors":[{"code":"UNSUPPORTED","message":"delete a manifest by its digest"}]}`, http.StatusMethodNotAllowed)
		return
	}
	for _, tag := range r.tagsOf(inner, repo, ref) {
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/v2/"+repo+"/manifests/"+tag, nil))
	}
	rec := httptest.NewRecorder()
	inner.ServeHTTP(rec, req)
	if rec.Code == http.StatusAccepted {
		r.Deletes.Add(1)
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

// tagsOf lists the tags of repo that name manifest digest.
func (r *Registry) tagsOf(inner http.Handler, repo, digest string) []string {
	rec := httptest.NewRecorder()
	inner.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v2/"+repo+"/tags/list", nil))
	var list struct {
		Tags []string `json:"tags"`
	}
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &list) != nil {
		return nil
	}
	var out []string
	for _, tag := range list.Tags {
		head := httptest.NewRecorder()
		inner.ServeHTTP(head, httptest.NewRequest(http.MethodHead, "/v2/"+repo+"/manifests/"+tag, nil))
		if head.Header().Get("Docker-Content-Digest") == digest {
			out = append(out, tag)
		}
	}
	return out
}

// SetDeleteRefused makes manifest deletes answer 405 UNSUPPORTED, as a
// distribution registry without storage.delete.enabled does.
func (r *Registry) SetDeleteRefused(refused bool) { r.refuseDeletes.Store(refused) }

// SetDown makes every request fail with 503 (an outage), or ends it.
func (r *Registry) SetDown(down bool) { r.down.Store(down) }

// SetDelay makes every request wait d before it is served (a slow or
// overloaded registry).
func (r *Registry) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// SetIgnoreRange makes blob downloads ignore Range headers and answer
// 200 with the whole blob, as some registries and proxies do.
func (r *Registry) SetIgnoreRange(ignore bool) { r.ignoreRange.Store(ignore) }

// SetFlipByte makes downloads of blob digest ("sha256:...") carry byte at
// of the blob flipped, whatever range they ask for; at < 0 ends it.
func (r *Registry) SetFlipByte(digest string, at int64) {
	if at < 0 {
		r.flip.Store(nil)
		return
	}
	r.flip.Store(&flip{digest: digest, at: at})
}

// SetCorrupt makes blob downloads return the wrong bytes.
func (r *Registry) SetCorrupt(corrupt bool) { r.corrupt.Store(corrupt) }

// DockerConfig is a docker config.json with user and password for the
// registry, keyed as docker login writes it.
func (r *Registry) DockerConfig(user, password string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	return []byte(fmt.Sprintf(`{"auths":{"https://%s":{"auth":%q}}}`, r.Host, auth))
}
