// Package tree copies, measures and empties directory trees through
// directory file descriptors, reading directories in chunks: neither a
// tree's depth (longer than PATH_MAX) nor a directory's size (millions of
// entries) matters. Each copied entry is a fault point (ondisk), so the
// crash tests can stop a squash or a control directory's copy anywhere.
package tree
