package layerfs

import (
	"context"
	"fmt"
)

// EndOptions are how End decides a volume's fate.
type EndOptions struct {
	// ControlFiles are the names under ControlDir that Decide is told
	// about.
	ControlFiles []string
	// Decide says whether the volume's changes are kept, given which of
	// ControlFiles the build wrote (regular files only, as
	// wroteControlFile decides). nil keeps them. A read-only volume is
	// never kept, whatever Decide says.
	Decide func(written map[string]bool) bool
	// BeforeSeal runs once the volume is to be committed and has
	// changes, before it is sealed: sealing a large delta takes seconds,
	// and the agent announces the commit to other nodes meanwhile. It
	// runs under the volume's lock and must not call the store.
	BeforeSeal func()
}

// EndResult is what End did. On an error it still tells what End read
// and whether BeforeSeal ran.
type EndResult struct {
	// Kept: Decide kept the changes, so a commit ran; false: the volume
	// was discarded.
	Kept bool
	// Written has an entry for each of EndOptions.ControlFiles: whether
	// the build wrote it (the agent explains a discard with it).
	Written map[string]bool
	// Announced: BeforeSeal ran.
	Announced bool
	// Commit is what the commit did when Kept.
	Commit CommitResult
	// FailedRead says why the volume was discarded whatever Decide said:
	// a read of a layer mounted before its bytes were here failed while
	// the volume was mounted, so what the build wrote may rest on errors.
	FailedRead string
}

// End ends a volume whose build ended: it reads which of
// opts.ControlFiles the build wrote, asks opts.Decide whether to keep the
// changes, and commits (running opts.BeforeSeal first when the volume has
// changes) or discards, as Commit and Discard do, under one
// transaction's locks: nothing changes the volume between what the
// decision read and what it does. ErrNotFound if the volume had already
// ended.
func (s *Store) End(ctx context.Context, volumeID string, opts EndOptions) (res EndResult, err error) {
	for _, name := range opts.ControlFiles {
		if err := ValidateName("control file", name); err != nil {
			return res, err
		}
	}
	err = s.endVolume(ctx, commitScope(volumeID), func(t *txn) (ending, error) {
		return s.endIn(ctx, t, opts, &res)
	})
	return res, err
}

// endIn decides and ends the volume of t, a transaction over
// commitScope, recording in res what it read and did. A discard locks
// the cache at once, as Discard's scope does.
func (s *Store) endIn(ctx context.Context, t *txn, opts EndOptions, res *EndResult) (e ending, err error) {
	r, err := s.liveVolume(t)
	if err != nil {
		return e, err
	}
	if res.Written, err = s.controlFiles(r, opts.ControlFiles); err != nil {
		return e, err
	}
	res.FailedRead = s.sawFailedRead(r)
	res.Kept = !r.ReadOnly && res.FailedRead == "" && (opts.Decide == nil || opts.Decide(res.Written))
	if !res.Kept {
		if err := t.lockCache(ctx); err != nil {
			return e, err
		}
		return s.discardIn(t)
	}
	if res.Announced, err = s.beforeSeal(r, opts.BeforeSeal); err != nil {
		return e, err
	}
	res.Commit, e, err = s.commitIn(ctx, t)
	return e, err
}

// controlFiles tells which of names volume r's build wrote.
func (s *Store) controlFiles(r *volumeRecord, names []string) (map[string]bool, error) {
	written := make(map[string]bool, len(names))
	for _, name := range names {
		found, err := s.wroteControlFile(r, name)
		if err != nil {
			return nil, fmt.Errorf("volume %q: read control file %s: %w", r.ID, name, err)
		}
		written[name] = found
	}
	return written, nil
}

// beforeSeal runs hook if volume r has changes to commit, and tells
// whether it ran.
func (s *Store) beforeSeal(r *volumeRecord, hook func()) (bool, error) {
	if hook == nil {
		return false, nil
	}
	changed, err := s.layoutOf(r.Layout).changed(r)
	if err != nil {
		return false, fmt.Errorf("volume %q: look for changes: %w", r.ID, err)
	}
	if changed {
		hook()
	}
	return changed, nil
}
