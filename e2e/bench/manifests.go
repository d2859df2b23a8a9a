package bench

import (
	"bufio"
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// The peer as manifests/local-path.yaml deploys it; the unit tests keep the
// two in step.
const (
	Peer             = "rancher/local-path-provisioner v0.0.33"
	PeerNamespace    = "local-path-bench"
	PeerDeployment   = "local-path-provisioner"
	PeerConfigMap    = "local-path-config"
	PeerStorageClass = "local-path-bench"
	PeerProvisioner  = "bench.layercache.dev/local-path"
	PeerImage        = "localhost/local-path-provisioner:e2e"
	// NodeRoot holds all the benchmark writes on the node outside
	// layercache's store; the benchmark removes it when it is done.
	NodeRoot = "/var/lib/layercache-bench"
	// PeerNodePath is where local-path keeps its volumes.
	PeerNodePath = NodeRoot + "/local-path"
	// LayercacheRoot is layercache's store on the node (docs/operating.md, "The node's store").
	LayercacheRoot = "/var/lib/layercache"
)

// BenchLabel marks the namespaces of the benchmark, so that a later run
// finds and removes what an interrupted one left.
const BenchLabel = "layercache.dev/bench"

//go:embed manifests/local-path.yaml
var peerManifest []byte

// PeerObjects decodes the peer's manifest into typed objects.
func PeerObjects() ([]runtime.Object, error) {
	return decodeObjects(peerManifest)
}

func decodeObjects(manifest []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	// Strict: a misspelt field fails here rather than being dropped by the
	// API server.
	decode := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true}).Decode
	var objs []runtime.Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decoding document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
}

// stripComments drops whole-line comments, so that a document of only
// comments counts as empty.
func stripComments(doc []byte) []byte {
	var out []byte
	for line := range bytes.Lines(doc) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] == '#' {
			continue
		}
		out = append(out, line...)
	}
	return out
}
