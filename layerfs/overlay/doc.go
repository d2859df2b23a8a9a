// Package overlay is the kernel side of layerfs's overlay layout: an
// overlay mount described as data (Spec), mounted through mount(2) or,
// for chains longer than a page of options, the new mount API; the probe
// that proves a filesystem can host upper directories; and what a
// whiteout is. Which layers a volume stacks, and what its commit makes of
// its upper directory, is the store's (layerfs).
package overlay
