// Package flock is the store's locks: flock(2) on lock files, which work
// across processes (the node agent and the CLI share a store), can be
// waited for with a context, and survive their file's removal (a waiter
// notices the unlinked inode and retries on a fresh file). Gates queue a
// process's own waiters in memory ahead of the flock, so that a busy lock
// passes on at once.
package flock
