// Package receive is how a pulled layer image's bytes reach the disk:
// read and written on two goroutines (CopyPipelined), into a file whose
// long runs of zeros stay holes (SparseWriter), with writeback started as
// the stream goes, and stopped with its context. What the bytes must be
// (an EROFS image of the announced size) is layerfs's and erofs's.
package receive
