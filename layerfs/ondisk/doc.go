// Package ondisk is how layerfs and its layouts change state on disk: atomic
// file writes, durable renames, syncs and unmounts, each marked with a
// fault point at which the crash tests kill the process, and the group
// through which concurrent commits share one syncfs. It sits below the
// store and the layouts, which all make their durable steps through it, so
// that one fault hook covers every step.
package ondisk
