package layerfs

import (
	"errors"
	"fmt"
)

// Layout is how a cache's data is kept on the node. A cache has one layout
// for life: its head records it when the cache is created.
type Layout string

const (
	// LayoutOverlay keeps a cache as a stack of overlay layers; a volume
	// is an overlay mount (the default; "" means overlay).
	LayoutOverlay Layout = "overlay"
	// LayoutSnapshot keeps a cache as a read-only btrfs subvolume; a
	// volume is a writable snapshot of it, so overlay-based storage
	// (BuildKit, podman, Docker) can live in it, and a size limit is
	// enforced live (a qgroup). Its subvolumes live in <root>/snapshot
	// (package snapshot). On a btrfs root, the first snapshot mount turns
	// quotas on for that whole filesystem (simple quotas where the kernel
	// has them); quotas already on keep their mode.
	LayoutSnapshot Layout = "snapshot"
)

// ErrLayoutMismatch is returned (wrapped) when a cache is mounted with a
// layout other than the one it was created with.
var ErrLayoutMismatch = errors.New("layout mismatch")

// ParseLayout parses a layout name; "" is the default, overlay.
func ParseLayout(s string) (Layout, error) {
	switch Layout(s) {
	case "", LayoutOverlay:
		return LayoutOverlay, nil
	case LayoutSnapshot:
		return LayoutSnapshot, nil
	}
	return "", fmt.Errorf("invalid layout %q: use %q (the default) or %q (btrfs subvolumes)", s, LayoutOverlay, LayoutSnapshot)
}

// orDefault is l with "" read as overlay, the layout of every cache made
// before layouts existed.
func (l Layout) orDefault() Layout {
	if l == "" {
		return LayoutOverlay
	}
	return l
}

// checkLayout refuses to use a cache of one layout as the other.
func checkLayout(cache CacheRef, has, want Layout) error {
	if has.orDefault() == want.orDefault() {
		return nil
	}
	return fmt.Errorf("cache %s has the %s layout and cannot be mounted with the %s layout: a cache keeps its layout for life; mount it with layout %s, or remove it first: %w",
		cache, has.orDefault(), want.orDefault(), has.orDefault(), ErrLayoutMismatch)
}
