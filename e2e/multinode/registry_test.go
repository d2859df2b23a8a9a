//go:build e2e && multinode

// Package multinode holds the scenarios that need two nodes and the
// cluster's registry. `make e2e` runs them after the one-node suite, on a
// fresh `make up NODES=2` cluster (e2e/README.md, "The registry"); the
// build tag multinode keeps them out of the one-node run.
package multinode

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/e2e/framework"
)

// defaultStorageClass is config/storage's class, which the registry's class
// copies but for its parameters.
const defaultStorageClass = "layercache"

// TestRegistryServesTheCluster pins what the two-node scenarios stand on:
// two Ready nodes; the registry of cluster.json, which answers over TLS
// that the cluster's CA verifies to its credentials and refuses others;
// the Secrets and the StorageClass that point the node agents at it; and
// a stop and start of the registry, the outage the scenarios simulate,
// that keeps its blobs. It stops the registry, so it runs alone (no
// t.Parallel: Go runs the parallel tests after it).
func TestRegistryServesTheCluster(t *testing.T) {
	f := framework.NewAcrossNodes(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	reg := f.Cluster.Registry
	if reg == nil {
		t.Fatal("cluster.json has no registry: start the cluster with `make up NODES=2`")
	}
	client, err := reg.HTTPClient()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("two ready nodes", func(t *testing.T) {
		nodes, err := f.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ready []string
		for _, n := range nodes.Items {
			if nodeReady(n) {
				ready = append(ready, n.Name)
			}
		}
		slices.Sort(ready)
		if want := f.Cluster.NodeNames(); len(want) != 2 || len(nodes.Items) != 2 || !slices.Equal(ready, want) {
			t.Fatalf("Ready nodes %v (of %d), harness nodes %v; want the same two", ready, len(nodes.Items), want)
		}
	})

	t.Run("TLS and credentials", func(t *testing.T) {
		_, port, err := net.SplitHostPort(reg.Address)
		if err != nil {
			t.Fatalf("registry address %q: %v", reg.Address, err)
		}
		// The certificate names both; the Secrets use the address.
		for _, host := range []string{reg.Address, "localhost:" + port} {
			url := "https://" + host + "/v2/"
			resp, err := get(ctx, client, url, reg.Username, reg.Password)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Distribution-Api-Version") != "registry/2.0" {
				t.Errorf("GET %s with the credentials: %s, API version %q; want 200 OK from a registry/2.0",
					url, resp.Status, resp.Header.Get("Docker-Distribution-Api-Version"))
			}
		}
		url := "https://" + reg.Address + "/v2/"
		for _, c := range []struct{ name, user, password string }{
			{"a wrong password", reg.Username, reg.Password + "x"},
			{"another user", reg.Username + "x", reg.Password},
			{"no credentials", "", ""},
		} {
			resp, err := get(ctx, client, url, c.user, c.password)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
				t.Errorf("GET %s with %s: %s, WWW-Authenticate %q; want 401 with a Basic challenge",
					url, c.name, resp.Status, resp.Header.Get("WWW-Authenticate"))
			}
		}
		// Without the cluster's CA the certificate is not trusted: it is
		// the harness's, not one the system knows.
		_, err = get(ctx, &http.Client{Timeout: 30 * time.Second}, url, reg.Username, reg.Password)
		var unknownAuthority x509.UnknownAuthorityError
		if !errors.As(err, &unknownAuthority) {
			t.Errorf("GET %s trusting the system's CAs only: %v; want an unknown authority error", url, err)
		}
	})

	t.Run("secrets", func(t *testing.T) {
		ca, err := os.ReadFile(reg.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		good := readRegistrySecret(ctx, t, f, reg.Secret)
		bad := readRegistrySecret(ctx, t, f, reg.BadSecret)
		for _, s := range []registrySecret{good, bad} {
			if !bytes.Equal(s.ca, ca) {
				t.Errorf("Secret %s: ca.crt is not the cluster's CA %s", s.name, reg.CAFile)
			}
			if s.address != reg.Address || s.username != reg.Username {
				t.Errorf("Secret %s: auths for %s user %q; want %s user %q", s.name, s.address, s.username, reg.Address, reg.Username)
			}
		}
		if good.password != reg.Password {
			t.Errorf("Secret %s: the password is not cluster.json's", good.name)
		}
		if bad.password == reg.Password {
			t.Errorf("Secret %s: the password is the right one; want a wrong one", bad.name)
		}
		file, err := os.ReadFile(reg.DockerConfig)
		if err != nil {
			t.Fatal(err)
		}
		if !jsonEqual(file, good.dockerConfig) {
			t.Errorf("Secret %s: .dockerconfigjson differs from %s", good.name, reg.DockerConfig)
		}

		// What a node agent does with each: trust the Secret's CA, send its
		// credentials.
		for _, c := range []struct {
			secret registrySecret
			want   int
		}{{good, http.StatusOK}, {bad, http.StatusUnauthorized}} {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(c.secret.ca) {
				t.Fatalf("Secret %s: ca.crt holds no PEM certificate", c.secret.name)
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
			url := "https://" + c.secret.address + "/v2/"
			resp, err := get(ctx, &http.Client{Transport: tr, Timeout: 30 * time.Second}, url, c.secret.username, c.secret.password)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != c.want {
				t.Errorf("GET %s with Secret %s: %s; want %d", url, c.secret.name, resp.Status, c.want)
			}
		}
	})

	t.Run("storage class", func(t *testing.T) {
		classes := f.Client.StorageV1().StorageClasses()
		sc, err := classes.Get(ctx, reg.StorageClass, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		def, err := classes.Get(ctx, defaultStorageClass, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"registry": reg.Address + "/caches", "registrySecret": reg.Secret}
		if !maps.Equal(sc.Parameters, want) || reg.Repository != want["registry"] {
			t.Errorf("StorageClass %s: parameters %v, cluster.json's repository %q; want %v", sc.Name, sc.Parameters, reg.Repository, want)
		}
		if got, want := classShape(sc), classShape(def); got != want {
			t.Errorf("StorageClass %s is %s; want it like %s: %s", sc.Name, got, def.Name, want)
		}
	})

	t.Run("restart keeps blobs", func(t *testing.T) {
		repo := strings.TrimPrefix(reg.Repository, reg.Address+"/") + "/" + f.Namespace + "/probe"
		blob := make([]byte, 256<<10)
		rand.Read(blob)
		digest := fmt.Sprintf("sha256:%x", sha256.Sum256(blob))
		blobURL := "https://" + reg.Address + "/v2/" + repo + "/blobs/" + digest
		if err := pushBlob(ctx, client, reg, repo, digest, blob); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			// A test that stopped the registry and failed leaves it running
			// for the next one.
			if err := f.Cluster.StartRegistry(ctx); err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, blobURL, nil)
			req.SetBasicAuth(reg.Username, reg.Password)
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("cleanup: DELETE %s: %v", blobURL, err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				t.Errorf("cleanup: DELETE %s: %s; want 202 Accepted", blobURL, resp.Status)
			}
		})

		if err := f.Cluster.StopRegistry(ctx); err != nil {
			t.Fatal(err)
		}
		if resp, err := get(ctx, client, blobURL, reg.Username, reg.Password); err == nil {
			t.Fatalf("GET %s with the registry stopped: %s; want no answer", blobURL, resp.Status)
		}
		if err := f.Cluster.StartRegistry(ctx); err != nil {
			t.Fatal(err)
		}
		resp, err := get(ctx, client, blobURL, reg.Username, reg.Password)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !bytes.Equal(resp.body, blob) {
			t.Errorf("GET %s after a restart: %s, %d bytes; want 200 OK and the %d bytes pushed", blobURL, resp.Status, len(resp.body), len(blob))
		}
	})
}

type response struct {
	*http.Response
	body []byte
}

// get GETs url, with basic auth unless user is empty, and reads the body.
func get(ctx context.Context, client *http.Client, url, user, password string) (*response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading the body: %w", url, err)
	}
	return &response{Response: resp, body: body}, nil
}

// pushBlob uploads blob to repo in one PUT (the distribution API's
// monolithic upload: POST opens the upload, PUT with the digest ends it).
func pushBlob(ctx context.Context, client *http.Client, reg *framework.Registry, repo, digest string, blob []byte) error {
	do := func(method, url string, body []byte, want int) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.SetBasicAuth(reg.Username, reg.Password)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			return nil, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(msg))
		}
		return resp, nil
	}
	resp, err := do(http.MethodPost, "https://"+reg.Address+"/v2/"+repo+"/blobs/uploads/", nil, http.StatusAccepted)
	if err != nil {
		return err
	}
	loc, err := resp.Location()
	if err != nil {
		return fmt.Errorf("POST of an upload to %s: %w", repo, err)
	}
	q := loc.Query()
	q.Set("digest", digest)
	loc.RawQuery = q.Encode()
	_, err = do(http.MethodPut, loc.String(), blob, http.StatusCreated)
	return err
}

type registrySecret struct {
	name, address, username, password string
	ca, dockerConfig                  []byte
}

// readRegistrySecret reads a Secret of the contract (e2e/README.md, "The
// registry"): type kubernetes.io/dockerconfigjson in the node agents'
// namespace, .dockerconfigjson with one registry's auths, ca.crt.
func readRegistrySecret(ctx context.Context, t *testing.T, f *framework.Framework, name string) registrySecret {
	t.Helper()
	s, err := f.Client.CoreV1().Secrets(framework.SystemNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != corev1.SecretTypeDockerConfigJson {
		t.Errorf("Secret %s: type %s; want %s", name, s.Type, corev1.SecretTypeDockerConfigJson)
	}
	if keys := slices.Sorted(maps.Keys(s.Data)); !slices.Equal(keys, []string{corev1.DockerConfigJsonKey, "ca.crt"}) {
		t.Errorf("Secret %s: keys %v; want %s and ca.crt", name, keys, corev1.DockerConfigJsonKey)
	}
	var config struct {
		Auths map[string]struct {
			Username string `json:"username"`
			Password string `json:"password"`
			Auth     string `json:"auth"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &config); err != nil {
		t.Fatalf("Secret %s: %s: %v", name, corev1.DockerConfigJsonKey, err)
	}
	if len(config.Auths) != 1 {
		t.Fatalf("Secret %s: auths for %v; want one registry", name, slices.Sorted(maps.Keys(config.Auths)))
	}
	out := registrySecret{name: name, ca: s.Data["ca.crt"], dockerConfig: s.Data[corev1.DockerConfigJsonKey]}
	for address, a := range config.Auths {
		out.address, out.username, out.password = address, a.Username, a.Password
		if want := base64.StdEncoding.EncodeToString([]byte(a.Username + ":" + a.Password)); a.Auth != want {
			t.Errorf("Secret %s: auth %q is not base64 of username:password", name, a.Auth)
		}
	}
	return out
}

// classShape is what a StorageClass is but for its name and parameters.
func classShape(sc *storagev1.StorageClass) string {
	mode, reclaim, expand := "<nil>", "<nil>", "<nil>"
	if sc.VolumeBindingMode != nil {
		mode = string(*sc.VolumeBindingMode)
	}
	if sc.ReclaimPolicy != nil {
		reclaim = string(*sc.ReclaimPolicy)
	}
	if sc.AllowVolumeExpansion != nil {
		expand = fmt.Sprint(*sc.AllowVolumeExpansion)
	}
	return fmt.Sprintf("provisioner %s, volumeBindingMode %s, reclaimPolicy %s, allowVolumeExpansion %s",
		sc.Provisioner, mode, reclaim, expand)
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xs, _ := json.Marshal(x)
	ys, _ := json.Marshal(y)
	return bytes.Equal(xs, ys)
}

func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
