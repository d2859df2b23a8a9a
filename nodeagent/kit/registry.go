package kit

import (
	"errors"
	"fmt"
	"strings"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/layercache/layercache/layerfs"
)

// StorageClass parameters of caches that span nodes through a registry.
const (
	// ParamRegistry is a repository prefix (HOST[:PORT]/PATH); a cache's
	// repository is PREFIX/NAMESPACE/NAME.
	ParamRegistry = "registry"
	// ParamRegistrySecret names a Secret in the node agents' namespace
	// with the registry's credentials (.dockerconfigjson, as image pull
	// secrets have) and, optionally, its CA (ca.crt). The agents' own
	// namespace, not the claim's: StorageClasses are the cluster admin's,
	// and node agents may read Secrets there only.
	ParamRegistrySecret = "registrySecret"
	// ParamSyncTimeout bounds how long a claim waits for the layers its
	// node lacks before it mounts what the node has.
	ParamSyncTimeout = "syncTimeout"
	// ParamMaxLayerSize bounds each layer a node fetches for the class's
	// claims (a quantity such as 20Gi), checked before a byte is fetched
	// and while it is written. Absent, the claim's storage request bounds
	// it, as it bounds what the claim's build may add; "0" lifts the bound.
	ParamMaxLayerSize = "maxLayerSize"
	// ParamMountFirst is "true" (the default) or "false". True: a node
	// mounts a published layer it lacks at once and fetches by range what
	// the build reads, the rest in the background. False: a node fetches
	// whole layers before the volume is ready, within syncTimeout.
	ParamMountFirst = "mountFirst"

	defaultSyncTimeout = time.Minute
)

// RegistryParams are a class's registry parameters, validated.
type RegistryParams struct {
	Class       string
	Prefix      string
	Secret      string
	SyncTimeout time.Duration
	// MaxLayerBytes is the class's maxLayerSize (0: no bound); it counts
	// only if MaxLayerSet, else the claim's storage request does.
	MaxLayerBytes int64
	MaxLayerSet   bool
	// MountFirst is the class's mountFirst: layers with an index are
	// mounted before their bytes are here, and read by range.
	MountFirst bool
	// Layout is the class's layout: a node that lacks the cache makes it
	// of this layout from the chain (a snapshot cache's chain layers are
	// whole generations).
	Layout layerfs.Layout
}

// RegistryRef is where one cache syncs to, and within which bounds.
type RegistryRef struct {
	Repository  string
	Secret      string
	SyncTimeout time.Duration
	// Class is the StorageClass the registry comes from.
	Class string
	// MaxLayerBytes bounds each fetched layer; 0 means no bound.
	MaxLayerBytes int64
	// BoundFrom says where MaxLayerBytes comes from, for messages.
	BoundFrom string
	// MountFirst mounts layers with an index before their bytes are here.
	MountFirst bool
	// Layout is the layout of a cache the sync creates.
	Layout layerfs.Layout
}

// Repository is the repository of cache c under the class's prefix.
func (r *RegistryParams) Repository(c layerfs.CacheRef) string {
	return r.Prefix + "/" + c.Namespace + "/" + c.Name
}

// ForCache is where cache c syncs for a claim that requests
// requestBytes of storage.
func (r *RegistryParams) ForCache(c layerfs.CacheRef, requestBytes int64) *RegistryRef {
	if r == nil {
		return nil
	}
	ref := &RegistryRef{Repository: r.Repository(c), Secret: r.Secret, SyncTimeout: r.SyncTimeout, Class: r.Class, MountFirst: r.MountFirst, Layout: r.Layout}
	switch {
	case r.MaxLayerSet:
		ref.MaxLayerBytes, ref.BoundFrom = r.MaxLayerBytes, r.BoundFrom()
	case requestBytes > 0:
		ref.MaxLayerBytes, ref.BoundFrom = requestBytes, BoundFromClaim
	}
	return ref
}

// BoundFromClaim names the claim's storage request as a layer bound.
const BoundFromClaim = "the claim's storage request"

// BoundFrom names the class's maxLayerSize as a layer bound.
func (r *RegistryParams) BoundFrom() string {
	return fmt.Sprintf("parameter %s of StorageClass %q", ParamMaxLayerSize, r.Class)
}

// ParseRegistry reads the registry parameters; nil when the class has none.
func ParseRegistry(class *storagev1.StorageClass) (*RegistryParams, error) {
	prefix, ok := class.Parameters[ParamRegistry]
	if !ok {
		for _, k := range []string{ParamRegistrySecret, ParamSyncTimeout, ParamMaxLayerSize, ParamMountFirst} {
			if _, set := class.Parameters[k]; set {
				return nil, classError(class.Name, "parameter %s is set without %s; set %s to a repository prefix such as registry.example:5000/ci-caches, or remove %s", k, ParamRegistry, ParamRegistry, k)
			}
		}
		return nil, nil
	}
	host, path, _ := strings.Cut(prefix, "/")
	if host == "" || path == "" || strings.HasSuffix(prefix, "/") || strings.Contains(prefix, "://") {
		return nil, classError(class.Name, "parameter %s has value %q: use a repository prefix HOST[:PORT]/PATH without a scheme, such as registry.example:5000/ci-caches (each cache syncs to PREFIX/NAMESPACE/NAME)", ParamRegistry, prefix)
	}
	p := &RegistryParams{Class: class.Name, Prefix: prefix, Secret: class.Parameters[ParamRegistrySecret], SyncTimeout: defaultSyncTimeout, MountFirst: true}
	if v, ok := class.Parameters[ParamSyncTimeout]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return nil, classError(class.Name, "parameter %s has value %q: use a duration such as 60s, or 0 to mount what the node has without waiting", ParamSyncTimeout, v)
		}
		p.SyncTimeout = d
	}
	if v, ok := class.Parameters[ParamMaxLayerSize]; ok {
		n, err := parseMaxLayerSize(v)
		if err != nil {
			return nil, classError(class.Name, "parameter %s has value %q: %v; use a size such as 20Gi, or 0 for no bound (without the parameter, each claim's storage request bounds the layers it fetches)", ParamMaxLayerSize, v, err)
		}
		p.MaxLayerBytes, p.MaxLayerSet = n, true
	}
	if v, ok := class.Parameters[ParamMountFirst]; ok {
		// Only the two spellings docs/reference.md gives: a class that says
		// "yes" or "False" is a typo, better refused than guessed.
		switch v {
		case "true", "false":
			p.MountFirst = v == "true"
		default:
			return nil, classError(class.Name, "parameter %s has value %q: use \"true\" (the default: mount published layers at once and fetch by range what reads need) or \"false\" (fetch whole layers before the volume is ready)", ParamMountFirst, v)
		}
	}
	return p, nil
}

// parseMaxLayerSize reads a quantity of bytes, refusing what is not a
// whole, non-negative number of bytes.
func parseMaxLayerSize(v string) (int64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, errors.New("not a quantity")
	}
	if q.Sign() < 0 {
		return 0, errors.New("negative")
	}
	n, ok := q.AsInt64()
	if !ok {
		return 0, errors.New("not a whole number of bytes that fits 64 bits")
	}
	return n, nil
}
