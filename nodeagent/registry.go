package nodeagent

import (
	"fmt"
	"strings"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/layercache/layercache/layerfs"
)

// StorageClass parameters of caches that span nodes through a registry.
const (
	// paramRegistry is a repository prefix (HOST[:PORT]/PATH); a cache's
	// repository is PREFIX/NAMESPACE/NAME.
	paramRegistry = "registry"
	// paramRegistrySecret names a Secret in the node agents' namespace
	// with the registry's credentials (.dockerconfigjson, as image pull
	// secrets have) and, optionally, its CA (ca.crt). The agents' own
	// namespace, not the claim's: StorageClasses are the cluster admin's,
	// and node agents may read Secrets there only.
	paramRegistrySecret = "registrySecret"
	// paramSyncTimeout bounds how long a claim waits for the layers its
	// node lacks before it mounts what the node has.
	paramSyncTimeout = "syncTimeout"

	defaultSyncTimeout = time.Minute
)

// registryParams are a class's registry parameters, validated.
type registryParams struct {
	Prefix      string
	Secret      string
	SyncTimeout time.Duration
}

// registryRef is where one cache syncs to.
type registryRef struct {
	Repository  string
	Secret      string
	SyncTimeout time.Duration
}

func (r *registryParams) forCache(c layerfs.CacheRef) *registryRef {
	if r == nil {
		return nil
	}
	return &registryRef{Repository: r.Prefix + "/" + c.Namespace + "/" + c.Name, Secret: r.Secret, SyncTimeout: r.SyncTimeout}
}

// parseRegistry reads the registry parameters; nil when the class has none.
func parseRegistry(class *storagev1.StorageClass) (*registryParams, error) {
	prefix, ok := class.Parameters[paramRegistry]
	if !ok {
		for _, k := range []string{paramRegistrySecret, paramSyncTimeout} {
			if _, set := class.Parameters[k]; set {
				return nil, classError(class.Name, "parameter %s is set without %s; set %s to a repository prefix such as registry.example:5000/ci-caches, or remove %s", k, paramRegistry, paramRegistry, k)
			}
		}
		return nil, nil
	}
	host, path, _ := strings.Cut(prefix, "/")
	if host == "" || path == "" || strings.HasSuffix(prefix, "/") || strings.Contains(prefix, "://") {
		return nil, classError(class.Name, "parameter %s has value %q: use a repository prefix HOST[:PORT]/PATH without a scheme, such as registry.example:5000/ci-caches (each cache syncs to PREFIX/NAMESPACE/NAME)", paramRegistry, prefix)
	}
	p := &registryParams{Prefix: prefix, Secret: class.Parameters[paramRegistrySecret], SyncTimeout: defaultSyncTimeout}
	if v, ok := class.Parameters[paramSyncTimeout]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return nil, classError(class.Name, "parameter %s has value %q: use a duration such as 60s, or 0 to mount what the node has without waiting", paramSyncTimeout, v)
		}
		p.SyncTimeout = d
	}
	return p, nil
}

func (r *registryRef) String() string {
	if r.Secret == "" {
		return fmt.Sprintf("%s (no credentials)", r.Repository)
	}
	return fmt.Sprintf("%s (Secret %s)", r.Repository, r.Secret)
}
