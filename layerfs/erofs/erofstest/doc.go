// Package erofstest generates random overlay-format layer trees and
// compares two trees entry by entry. It is test support, imported only by
// tests: the EROFS image writer's tests (layerfs/erofs) check a mounted
// image against its source tree with it, and the store's cross-node test
// (layerfs) checks a layer pulled onto another node against the node that
// built it. Keeping one generator and one comparer means both test the
// same file kinds against the same rules.
//
// It must not import layerfs/erofs, whose internal tests import it; what
// it needs of the writer's format (the block size, which xattrs the writer
// drops) it restates, and says so where it does.
package erofstest
