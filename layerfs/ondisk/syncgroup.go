package ondisk

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// SyncGroup shares syncfs calls between the commits of one process: a
// commit needs a syncfs of its filesystem that starts after its writes,
// and one syncfs covers every write made before it started, whoever made
// it. So callers that arrive while a syncfs runs wait for it to end and
// then share the next one: N concurrent commits cost two syncfs, not N
// (which, besides, each wait on the same writeback of everyone's data).
type SyncGroup struct {
	mu  sync.Mutex
	fss map[uint64]*fsSync // by device
	// syncfs is SyncFS but in tests.
	syncfs func(path string) error
}

// fsSync is one filesystem's rounds: at most one syncfs runs, and the
// callers that arrive meanwhile gather in next.
type fsSync struct {
	running bool
	next    *syncRound
}

type syncRound struct {
	path string // one of its callers' paths, to open for the syncfs
	done chan struct{}
	err  error
}

// Sync returns once a syncfs of the filesystem that holds path, started
// after Sync was called, has ended; its error is that syncfs's.
func (g *SyncGroup) Sync(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	g.mu.Lock()
	if g.fss == nil {
		g.fss = map[uint64]*fsSync{}
	}
	fs := g.fss[st.Dev]
	if fs == nil {
		fs = &fsSync{}
		g.fss[st.Dev] = fs
	}
	if fs.next == nil {
		fs.next = &syncRound{path: path, done: make(chan struct{})}
	}
	r := fs.next
	if !fs.running {
		fs.running, fs.next = true, nil
		go g.run(fs, r)
	}
	g.mu.Unlock()
	<-r.done
	return r.err
}

// run runs round r, then the rounds that gathered meanwhile.
func (g *SyncGroup) run(fs *fsSync, r *syncRound) {
	syncfs := g.syncfs
	if syncfs == nil {
		syncfs = SyncFS
	}
	for r != nil {
		r.err = syncfs(r.path)
		close(r.done)
		g.mu.Lock()
		r, fs.next = fs.next, nil
		fs.running = r != nil
		g.mu.Unlock()
	}
}
