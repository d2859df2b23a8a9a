package framework

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// Registry is the OCI registry of the local cluster
// (e2e/cluster/registry.sh): Debian's docker-registry on loopback, TLS
// with a certificate from the cluster's CA, htpasswd auth for one user.
// up.sh writes it into cluster.json; e2e/README.md ("The registry") has the
// contract.
type Registry struct {
	// Address is host:port, 127.0.0.1:5443.
	Address string `json:"address"`
	// Repository is what the StorageClass's registry parameter names,
	// Address/caches; a cache's repository is Repository/NAMESPACE/NAME.
	Repository string `json:"repository"`
	// CAFile is the cluster's CA, which signed the registry's certificate.
	CAFile   string `json:"caFile"`
	Username string `json:"username"`
	Password string `json:"password"`
	// DockerConfig is a docker config.json with the credentials, the
	// .dockerconfigjson of Secret.
	DockerConfig string `json:"dockerConfig"`
	// Secret and BadSecret name kubernetes.io/dockerconfigjson Secrets in
	// SystemNamespace, with the CA as ca.crt: the credentials, and the
	// same user with a wrong password.
	Secret    string `json:"secret"`
	BadSecret string `json:"badSecret"`
	// StorageClass is a layercache class whose parameters are
	// registry: Repository and registrySecret: Secret.
	StorageClass string `json:"storageClass"`
	// Storage is where the registry keeps its blobs; they outlive a stop.
	Storage string `json:"storage"`
	// Log is the registry's log file.
	Log string `json:"log"`
	// Script is e2e/cluster/registry.sh (start|stop|status).
	Script string `json:"script"`
}

// registryScriptTimeout bounds a start or stop; the script's own waits are
// shorter (30 s to answer, 15 s to stop).
const registryScriptTimeout = 2 * time.Minute

// StopRegistry stops the cluster's registry, as an outage would; its
// blobs stay. It returns once the registry no longer runs.
func (c *Cluster) StopRegistry(ctx context.Context) error {
	return c.registryScript(ctx, "stop")
}

// StartRegistry starts the cluster's registry again with the blobs it had,
// and returns once it answers to its credentials.
func (c *Cluster) StartRegistry(ctx context.Context) error {
	return c.registryScript(ctx, "start")
}

func (c *Cluster) registryScript(ctx context.Context, verb string) error {
	if c.Registry == nil {
		return fmt.Errorf("the cluster has no registry in cluster.json: start the cluster with `make up NODES=2` (or e2e/cluster/up.sh --with registry)")
	}
	ctx, cancel := context.WithTimeout(ctx, registryScriptTimeout)
	defer cancel()
	// The registry logs to its own file, so nothing outlives the command
	// on its output.
	out, err := exec.CommandContext(ctx, c.Registry.Script, verb).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s (registry log: %s)", c.Registry.Script, verb, err, strings.TrimSpace(string(out)), c.Registry.Log)
	}
	return nil
}

// gcAttempts bounds the dry runs of RegistryGarbage: a collection that
// walks the storage while a scenario pushes can trip over a file that
// appears or goes under it.
const gcAttempts = 3

// gcEligible is how the registry's garbage collection names a blob it
// would delete.
var gcEligible = regexp.MustCompile(`blob eligible for deletion: (sha256:[0-9a-f]{64})`)

// RegistryGarbage runs the registry's garbage collection as a dry run
// (registry.sh gc-dry-run) and returns the digests of the blobs it would
// delete: those that no manifest of any repository names. It deletes
// nothing: the real collection would also take the blobs of parallel
// scenarios whose manifests are not pushed yet.
func (c *Cluster) RegistryGarbage(ctx context.Context) (map[string]bool, error) {
	if c.Registry == nil {
		return nil, fmt.Errorf("the cluster has no registry in cluster.json: start the cluster with `make up NODES=2` (or e2e/cluster/up.sh --with registry)")
	}
	ctx, cancel := context.WithTimeout(ctx, registryScriptTimeout)
	defer cancel()
	var err error
	for range gcAttempts {
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, c.Registry.Script, "gc-dry-run")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err = cmd.Run(); err != nil {
			err = fmt.Errorf("%s gc-dry-run: %w: %s", c.Registry.Script, err, lastLines(stderr.String(), 5))
			continue
		}
		garbage := map[string]bool{}
		for _, m := range gcEligible.FindAllStringSubmatch(stdout.String(), -1) {
			garbage[m[1]] = true
		}
		return garbage, nil
	}
	return nil, err
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TLSConfig trusts the cluster's CA, and only it, as a node agent given the
// Secret's ca.crt does.
func (r *Registry) TLSConfig() (*tls.Config, error) {
	pem, err := os.ReadFile(r.CAFile)
	if err != nil {
		return nil, fmt.Errorf("the registry's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the registry's CA %s holds no PEM certificate", r.CAFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// HTTPClient talks to the registry over TLS verified by the cluster's CA;
// requests carry no credentials unless the caller adds them.
func (r *Registry) HTTPClient() (*http.Client, error) {
	cfg, err := r.TLSConfig()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}
