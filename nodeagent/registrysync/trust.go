package registrysync

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	storagelisters "k8s.io/client-go/listers/storage/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
)

// The trust rules of a cache's published chain. status.published is
// written by node agents, but whoever else can write caches/status (a
// tenant given it by a wildcard role) can write it too. So an agent never
// takes the chain's word for where a cache lives or what its credentials
// are: it checks every chain it reads, for a pull and for a publish,
// against its own configuration (the StorageClasses it serves, which are
// the cluster admin's) and against the shape every chain the agents write
// has. A chain that fails is refused whole: nothing is fetched from or
// pushed to its repository.

// maxAppendsPerSecond bounds how fast a cache's chain can grow: each
// append is a build's commit, pushed and recorded with a Cache update.
// Ten a second for the Cache's whole life is far beyond any CI system's
// pace, and still keeps a generation from jumping toward overflow.
const maxAppendsPerSecond = 10

// untrustedError is a chain the agent refuses: Field of status.published
// has Value where the agent expected Expected.
type untrustedError struct {
	Cache    layerfs.CacheRef
	Field    string
	Value    string
	Expected string
}

func (e *untrustedError) Error() string {
	return fmt.Sprintf("the published chain of cache %s is not one this node trusts: status.published.%s is %s, but %s",
		e.Cache, e.Field, e.Value, e.Expected)
}

// trust checks chains against the StorageClasses the agent serves.
type trust struct {
	// classes lists the cluster's StorageClasses from the agent's shared
	// informer; nil trusts no registry.
	classes storagelisters.StorageClassLister
}

// chainCheck is what a chain is checked against besides the classes.
type chainCheck struct {
	// applied is the generation of the cache on this node (0 without
	// it): at least the generation of the last chain the node applied.
	applied int64
	// age is how long the Cache has existed (its creationTimestamp, which
	// the API server sets).
	age time.Duration
}

// check returns the registry the chain may be used with, or an
// *untrustedError that names what is wrong.
func (t *trust) check(ref layerfs.CacheRef, pub *v1alpha1.PublishedChain, c chainCheck) (*kit.RegistryRef, error) {
	reg, err := t.registry(ref, pub)
	if err != nil {
		return nil, err
	}
	if err := checkShape(ref, pub); err != nil {
		return nil, err
	}
	if err := checkJump(ref, pub, c); err != nil {
		return nil, err
	}
	return reg, nil
}

// registry finds the class the agent serves whose prefix makes the
// chain's repository for this cache and whose Secret is the chain's. A
// repository of another namespace's cache, or one of another prefix, is
// no class's; a Secret that no class pairs with the prefix would lend
// one registry's credentials to another.
func (t *trust) registry(ref layerfs.CacheRef, pub *v1alpha1.PublishedChain) (*kit.RegistryRef, error) {
	classes, err := t.registryClasses()
	if err != nil {
		return nil, err
	}
	var repos, secrets []string
	for _, p := range classes {
		if p.Repository(ref) != pub.Repository {
			repos = append(repos, p.Repository(ref))
			continue
		}
		if p.Secret == pub.Secret {
			// The class's settings, with no claim's bound: a claim's pull
			// uses its own reference, which has that too.
			reg := &kit.RegistryRef{Repository: pub.Repository, Secret: pub.Secret, Class: p.Class, SyncTimeout: p.SyncTimeout, MountFirst: p.MountFirst, Layout: p.Layout}
			if p.MaxLayerSet {
				reg.MaxLayerBytes, reg.BoundFrom = p.MaxLayerBytes, p.BoundFrom()
			}
			return reg, nil
		}
		secrets = append(secrets, fmt.Sprintf("%q (StorageClass %q)", p.Secret, p.Class))
	}
	if len(secrets) > 0 {
		return nil, &untrustedError{Cache: ref, Field: "secret", Value: fmt.Sprintf("%q", pub.Secret),
			Expected: fmt.Sprintf("the StorageClasses with that repository's prefix pair it with %s", strings.Join(slices.Compact(secrets), " or "))}
	}
	want := "no StorageClass of provisioner " + v1alpha1.ProvisionerName + " has a registry parameter"
	if len(repos) > 0 {
		slices.Sort(repos)
		want = "the StorageClasses of provisioner " + v1alpha1.ProvisionerName + " make it " + strings.Join(slices.Compact(repos), " or ")
	}
	return nil, &untrustedError{Cache: ref, Field: "repository", Value: fmt.Sprintf("%q", pub.Repository), Expected: want}
}

// registryClasses are the registry parameters of the valid classes the
// agent serves; a class with invalid parameters vouches for nothing.
func (t *trust) registryClasses() ([]*kit.RegistryParams, error) {
	if t == nil || t.classes == nil {
		return nil, nil
	}
	classes, err := t.classes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list StorageClasses: %w", err)
	}
	slices.SortFunc(classes, func(a, b *storagev1.StorageClass) int { return strings.Compare(a.Name, b.Name) })
	var out []*kit.RegistryParams
	for _, c := range classes {
		if c.Provisioner != v1alpha1.ProvisionerName {
			continue
		}
		if p, err := kit.ParseRegistry(c); err == nil && p != nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// checkShape checks what every chain the agents write has: the newest
// layer carries the chain's generation, generations strictly decrease
// down the chain, a plain layer is one append (its generation is one
// above the layer below it), a squash stands for at least the layers it
// covers, digests parse and sizes are positive.
func checkShape(ref layerfs.CacheRef, pub *v1alpha1.PublishedChain) error {
	bad := func(field, value, expected string) error {
		return &untrustedError{Cache: ref, Field: field, Value: value, Expected: expected}
	}
	if err := checkAnnounced(pub.Announced, bad); err != nil {
		return err
	}
	if len(pub.Layers) == 0 {
		if pub.Generation != 0 {
			return bad("generation", fmt.Sprint(pub.Generation), "a chain without layers has generation 0")
		}
		return nil
	}
	if pub.Generation != pub.Layers[0].Generation {
		return bad("generation", fmt.Sprint(pub.Generation), fmt.Sprintf("the newest layer's generation, %d", pub.Layers[0].Generation))
	}
	if len(pub.Layers) > maxChainLayers {
		return bad("layers", fmt.Sprintf("%d layers", len(pub.Layers)), fmt.Sprintf("at most %d (the deepest overlay a node can mount; agents squash chains long before)", maxChainLayers))
	}
	seen := map[string]string{} // digest -> the field that named it first
	for i, l := range pub.Layers {
		field := fmt.Sprintf("layers[%d]", i)
		below := int64(0)
		if i+1 < len(pub.Layers) {
			below = pub.Layers[i+1].Generation
		}
		if err := checkLayer(field, l, below, bad); err != nil {
			return err
		}
		if err := checkOnce(field, l, seen, bad); err != nil {
			return err
		}
	}
	return nil
}

// maxChainLayers bounds a chain's length: a node stacks every layer of a
// cache in one overlay mount, which takes at most 500 layers.
const maxChainLayers = 500

// checkOnce refuses a layer whose digest, or a digest it covers, the
// chain named before: one blob listed many times would be fetched and
// stored as many times, past every bound on a layer.
func checkOnce(field string, l v1alpha1.PublishedLayer, seen map[string]string, bad func(field, value, expected string) error) error {
	names := map[string]string{field + ".digest": l.Digest}
	for j, d := range l.Covers {
		names[fmt.Sprintf("%s.covers[%d]", field, j)] = d
	}
	for _, f := range slices.Sorted(maps.Keys(names)) {
		d := names[f]
		// A squash may name what it covers (one layer squashed alone).
		if first, ok := seen[d]; ok && !strings.HasPrefix(first, field+".") {
			return bad(f, fmt.Sprintf("%q", d), fmt.Sprintf("a digest no other layer of the chain names (%s names it)", first))
		}
		seen[d] = f
	}
	return nil
}

// checkAnnounced bounds what readers act on: a node waits only for
// announcements of live nodes, and only within its sync timeout, so a
// forged one can delay a build, never stop it or make a node fetch.
func checkAnnounced(announced []v1alpha1.AnnouncedLayer, bad func(field, value, expected string) error) error {
	if len(announced) > maxAnnounced {
		return bad("announced", fmt.Sprintf("%d entries", len(announced)), fmt.Sprintf("at most %d", maxAnnounced))
	}
	for i, a := range announced {
		if msgs := validation.IsDNS1123Subdomain(a.Node); len(msgs) > 0 {
			return bad(fmt.Sprintf("announced[%d].node", i), fmt.Sprintf("%q", a.Node), "a node name")
		}
		if msgs := validation.IsDNS1123Label(a.Volume); len(msgs) > 0 {
			return bad(fmt.Sprintf("announced[%d].volume", i), fmt.Sprintf("%q", a.Volume), "a volume name")
		}
	}
	return nil
}

func checkLayer(field string, l v1alpha1.PublishedLayer, below int64, bad func(field, value, expected string) error) error {
	if _, err := digest.Parse(l.Digest); err != nil {
		return bad(field+".digest", fmt.Sprintf("%q", l.Digest), "a content digest such as sha256:<64 hex digits>")
	}
	for j, d := range l.Covers {
		if _, err := digest.Parse(d); err != nil {
			return bad(fmt.Sprintf("%s.covers[%d]", field, j), fmt.Sprintf("%q", d), "a content digest such as sha256:<64 hex digits>")
		}
	}
	if l.Size <= 0 {
		return bad(field+".size", fmt.Sprint(l.Size), "a positive size in bytes")
	}
	if err := checkIndex(field, l, bad); err != nil {
		return err
	}
	// The agents publish EROFS images only; a blob of any other type
	// would go down an import path no chain needs.
	if !remote.IsImage(l.MediaType) {
		return bad(field+".mediaType", fmt.Sprintf("%q", l.MediaType), fmt.Sprintf("an EROFS image layer, %s or %s", remote.MediaTypeImageZstd, remote.MediaTypeImageGzip))
	}
	switch gap := l.Generation - below; {
	case gap <= 0:
		return bad(field+".generation", fmt.Sprint(l.Generation), fmt.Sprintf("more than the generation below it, %d (generations strictly decrease down the chain)", below))
	case len(l.Covers) == 0 && gap != 1:
		return bad(field+".generation", fmt.Sprint(l.Generation), fmt.Sprintf("%d: a layer that is not a squash is one commit on the layer below it", below+1))
	case len(l.Covers) > 0 && gap < int64(len(l.Covers)):
		return bad(field+".generation", fmt.Sprint(l.Generation), fmt.Sprintf("at least %d: a squash of %d layers stands for at least %d commits on the layer below it", below+int64(len(l.Covers)), len(l.Covers), len(l.Covers)))
	}
	return nil
}

// checkIndex checks a layer's index blob: a sha256 digest (what pushes
// make, and what OpenIndex verifies) with a positive size, or neither.
// A size without a digest would be a chain no agent writes.
func checkIndex(field string, l v1alpha1.PublishedLayer, bad func(field, value, expected string) error) error {
	if l.Index == "" {
		if l.IndexSize != 0 {
			return bad(field+".indexSize", fmt.Sprint(l.IndexSize), "0 or absent, as the layer has no index")
		}
		return nil
	}
	if d, err := digest.Parse(l.Index); err != nil || d.Algorithm() != digest.SHA256 {
		return bad(field+".index", fmt.Sprintf("%q", l.Index), "a sha256 digest, sha256:<64 hex digits>")
	}
	if l.IndexSize <= 0 {
		return bad(field+".indexSize", fmt.Sprint(l.IndexSize), "a positive size in bytes, as the layer has an index")
	}
	return nil
}

// Bounds on an index blob, which a node reads whole into memory before
// it mounts the layer: a JSON header, and one entry (offset, size and a
// sha256) per frame of remote.FrameBytes, which takes about 110 bytes.
const (
	indexHeaderBytes = 64
	indexFrameBytes  = 256
	// unboundedImageBytes stands for the image size of a layer without a
	// bound (maxLayerSize 0), so that the index still has one.
	unboundedImageBytes = 256 << 30
)

// maxIndexBytes is the largest index of a layer of at most maxLayerBytes
// of image (0: no bound).
func maxIndexBytes(maxLayerBytes int64) int64 {
	if maxLayerBytes <= 0 {
		maxLayerBytes = unboundedImageBytes
	}
	// Rounded up without adding first: a bound near 2^63 would overflow.
	frames := maxLayerBytes / remote.FrameBytes
	if maxLayerBytes%remote.FrameBytes != 0 {
		frames++
	}
	return indexHeaderBytes + indexFrameBytes*frames
}

// checkIndexBounds refuses a chain with an index larger than a layer
// within maxLayerBytes has, as Sync refuses a blob larger than the bound
// (ErrTooLarge): the layer it maps would be over the bound too, or the
// index is not the one its layer was pushed with.
func checkIndexBounds(ref layerfs.CacheRef, pub *v1alpha1.PublishedChain, maxLayerBytes int64) error {
	limit := maxIndexBytes(maxLayerBytes)
	for i, l := range pub.Layers {
		if l.IndexSize > limit {
			return fmt.Errorf("layer %s of cache %s (layers[%d]): its index %s is %d bytes, over the %d bytes that the index of a layer within the bound of %d bytes takes: %w",
				l.Digest, ref, i, l.Index, l.IndexSize, limit, maxLayerBytes, layerfs.ErrTooLarge)
		}
	}
	return nil
}

// checkJump refuses a chain whose generation jumps past what could have
// happened since the node last applied one. Layerfs ignores chains older
// than the last it applied (a stale read must not roll a cache back), so
// a node that took an absurd generation would ignore every honest chain
// after it: sync frozen. The rule, with G the node's generation:
//
//   - Each chain layer newer than G that is not a squash is exactly one
//     commit (checkShape holds it to that), so a chain of such layers
//     may be at most G plus their number.
//   - A squash stands for the commits it merged, which may themselves
//     have been squashes: their number is not in the chain, so a layer
//     count cannot bound it without refusing honest chains (a node that
//     slept through a thousand commits since squashed into one layer).
//     What does bound it is time: no cache commits faster than
//     maxAppendsPerSecond over its Cache's life. A chain with a squash
//     newer than G may add that much.
//
// G is the node's generation, not the chain generation it last applied
// (the store keeps that to itself): it is at least that, as a Sync
// leaves the node at max(its own, the chain's + its unpublished layers)
// and commits only add, so the allowance errs on the strict side only
// by the node's own unpublished commits, whose layers the chain does
// not hold either.
func checkJump(ref layerfs.CacheRef, pub *v1alpha1.PublishedChain, c chainCheck) error {
	jump := pub.Generation - c.applied
	if jump <= 0 {
		return nil
	}
	var plain, squashes int64
	for _, l := range pub.Layers {
		if l.Generation <= c.applied {
			break
		}
		if len(l.Covers) == 0 {
			plain++
		} else {
			squashes++
		}
	}
	allowed := plain
	if squashes > 0 {
		allowed += (int64(c.age/time.Second) + 1) * maxAppendsPerSecond
	}
	if jump <= allowed {
		return nil
	}
	return &untrustedError{Cache: ref, Field: "generation", Value: fmt.Sprint(pub.Generation),
		Expected: fmt.Sprintf("at most %d: this node is at generation %d, and the chain's %d newer layers (%d of them squashes, of a Cache %s old) account for at most %d commits since",
			c.applied+allowed, c.applied, plain+squashes, squashes, c.age.Round(time.Second), allowed)}
}
