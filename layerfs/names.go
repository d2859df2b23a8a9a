package layerfs

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/layercache/layercache/layerfs/images"
	"github.com/layercache/layercache/layerfs/ondisk"
)

// ErrNotFound is returned (wrapped) for unknown volumes and caches.
var ErrNotFound = errors.New("not found")

// ErrBusy is returned (wrapped) when a volume's mount is still in use.
var ErrBusy = ondisk.ErrBusy

// ErrTooLarge is returned (wrapped) by Sync when a layer of the chain is
// larger than SyncOptions.MaxLayerBytes: nothing of it stays on the node.
var ErrTooLarge = images.ErrTooLarge

// ErrNoSpace is returned (wrapped) by Sync when the layers a chain adds
// do not fit in the store's free space: nothing is fetched.
var ErrNoSpace = errors.New("not enough free space")

// ErrInvalidImage is returned (wrapped) by Sync when a fetched layer
// image is not one this store writes (erofs.Check: an inode, directory or
// xattr out of bounds, a cycle, overlayfs's own xattrs): it is never
// mounted, and nothing of it stays on the node. The chain's publisher is
// not trusted for it; retrying fetches the same bytes.
var ErrInvalidImage = images.ErrInvalidImage

// ErrUnpublishable is returned (wrapped) by ExportLayer when the layer
// holds something its image cannot carry (the error names the path and
// why). Retrying does not help; a later squash or commit may.
var ErrUnpublishable = errors.New("layer cannot be published")

// maxNameLen is the DNS-1123 label limit that cache, namespace and volume
// names share; it also keeps mount option strings short.
const maxNameLen = 63

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// InvalidNameError says which name was refused, why, and how to fix it.
type InvalidNameError struct {
	Kind   string // "cache", "namespace" or "volume"
	Value  string
	Reason string
}

func (e *InvalidNameError) Error() string {
	return fmt.Sprintf("invalid %s name %q: %s; use a DNS-1123 label: at most %d characters of lower-case letters, digits and '-', starting and ending with a letter or digit",
		e.Kind, e.Value, e.Reason, maxNameLen)
}

// ValidateName checks that value is a DNS-1123 label, which also rules out
// path separators, "..", absolute paths and empty names before any of them
// reach the filesystem.
func ValidateName(kind, value string) error {
	reason := ""
	switch {
	case value == "":
		reason = "it is empty"
	case len(value) > maxNameLen:
		reason = fmt.Sprintf("it has %d characters", len(value))
	case strings.ContainsAny(value, `/\`) || strings.Contains(value, ".."):
		reason = "it contains a path separator or '..'"
	case strings.ToLower(value) != value:
		reason = "it contains upper-case letters"
	case !dns1123Label.MatchString(value):
		reason = "it contains characters other than a-z, 0-9 and '-', or starts or ends with '-'"
	}
	if reason == "" {
		return nil
	}
	return &InvalidNameError{Kind: kind, Value: value, Reason: reason}
}

// CacheRef names a cache: a Kubernetes namespace and a cache name.
type CacheRef struct {
	Namespace string
	Name      string
}

// ParseCacheRef parses "NAMESPACE/NAME".
func ParseCacheRef(s string) (CacheRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return CacheRef{}, fmt.Errorf("invalid cache reference %q: want NAMESPACE/NAME, for example default/maven", s)
	}
	ref := CacheRef{Namespace: ns, Name: name}
	return ref, ref.Validate()
}

// Validate checks both parts of the reference.
func (c CacheRef) Validate() error {
	if err := ValidateName("namespace", c.Namespace); err != nil {
		return err
	}
	return ValidateName("cache", c.Name)
}

func (c CacheRef) String() string { return c.Namespace + "/" + c.Name }

// MarshalText and UnmarshalText make a CacheRef a "NAMESPACE/NAME" string in JSON.
func (c CacheRef) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

func (c *CacheRef) UnmarshalText(b []byte) error {
	ref, err := ParseCacheRef(string(b))
	if err != nil {
		return err
	}
	*c = ref
	return nil
}
