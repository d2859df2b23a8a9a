package remote

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
)

// Credentials are what a docker config Secret holds for one registry.
type Credentials struct {
	// DockerConfigJSON is a ~/.docker/config.json, as in a Secret of type
	// kubernetes.io/dockerconfigjson; nil for anonymous access.
	DockerConfigJSON []byte
	// CAPEM are extra PEM certificates that the registry's TLS certificate
	// may chain to, besides the system's.
	CAPEM []byte
}

// Target is a cache's repository with what it takes to reach it.
type Target struct {
	Repository  name.Repository
	Compression Compression
	auth        authn.Authenticator
	transport   http.RoundTripper
}

// NewTarget parses repository ("host[:port]/path") and the credentials.
func NewTarget(repository string, creds Credentials, c Compression) (*Target, error) {
	repo, err := name.NewRepository(repository, name.StrictValidation)
	if err != nil {
		return nil, fmt.Errorf("registry repository %q is not valid (want HOST[:PORT]/PATH in lower case, for example registry.example:5000/ci-caches/team/maven): %w", repository, err)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	auth, err := authFor(repo.RegistryStr(), creds.DockerConfigJSON)
	if err != nil {
		return nil, err
	}
	transport, err := transportWith(creds.CAPEM)
	if err != nil {
		return nil, err
	}
	return &Target{Repository: repo, Compression: c, auth: auth, transport: transport}, nil
}

// dockerConfig is the part of a docker config.json that holds credentials.
type dockerConfig struct {
	Auths map[string]authn.AuthConfig `json:"auths"`
}

// authFor finds registry's entry in a docker config.json. Keys may carry a
// scheme or a path (https://host:port/v1/), as docker login writes them.
func authFor(registry string, configJSON []byte) (authn.Authenticator, error) {
	if len(configJSON) == 0 {
		return authn.Anonymous, nil
	}
	var cfg dockerConfig
	if err := json.Unmarshal(configJSON, &cfg); err != nil {
		return nil, fmt.Errorf("docker config JSON is not valid (want {\"auths\":{\"%s\":{\"username\":...,\"password\":...}}}): %w", registry, err)
	}
	for key, entry := range cfg.Auths {
		host := strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
		host, _, _ = strings.Cut(host, "/")
		if host == registry {
			return authn.FromConfig(entry), nil
		}
	}
	hosts := make([]string, 0, len(cfg.Auths))
	for key := range cfg.Auths {
		hosts = append(hosts, key)
	}
	return nil, fmt.Errorf("docker config JSON has no credentials for registry %s (it has %q); add an auths entry for %s", registry, hosts, registry)
}

// maxIdleConnsPerRegistry bounds the connections kept open to a registry
// between fetches.
const maxIdleConnsPerRegistry = 16

func transportWith(caPEM []byte) (http.RoundTripper, error) {
	base := http.DefaultTransport.(*http.Transport).Clone()
	// A lazily mounted layer's reads, their reads ahead and its fill fetch
	// ranges from one registry a dozen at a time: the default kept 2 idle
	// connections and closed the rest, so most fetches paid a new TLS
	// handshake.
	base.MaxIdleConnsPerHost = maxIdleConnsPerRegistry
	if len(caPEM) == 0 {
		return base, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("the registry CA holds no PEM certificate; put the CA's certificate (-----BEGIN CERTIFICATE-----) in the Secret's ca.crt")
	}
	base.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return base, nil
}

func (t *Target) options(ctxOpt ggcr.Option) []ggcr.Option {
	return []ggcr.Option{ctxOpt, ggcr.WithAuth(t.auth), ggcr.WithTransport(t.transport)}
}

func (t *Target) String() string { return t.Repository.String() }
