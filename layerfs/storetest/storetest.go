// Package storetest is the contract of a layer store, as containerd's
// snapshotter testsuite is that of a snapshotter: Run checks, against any
// implementation, the behaviour the node agent relies on (mount, commit,
// discard, a build's end, squash, removal, sync). layerfs runs it
// against the real Store; a fake for tests of the agent's decisions can
// run it too, to prove it behaves as the real one where the agent looks.
package storetest

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"path"
	"slices"
	"testing"

	"github.com/layercache/layercache/layerfs"
)

// Store is the behaviour under contract: the methods of *layerfs.Store
// that the node agent uses.
type Store interface {
	Mount(ctx context.Context, volumeID string, opts layerfs.MountOptions) (*layerfs.Volume, error)
	Commit(ctx context.Context, volumeID string) (layerfs.CommitResult, error)
	Discard(ctx context.Context, volumeID string) error
	Volume(ctx context.Context, volumeID string) (*layerfs.Volume, error)
	Squash(ctx context.Context, cache layerfs.CacheRef, maxLayers int) (layerfs.SquashResult, error)
	Remove(ctx context.Context, cache layerfs.CacheRef) error
	RemoveIfUnused(ctx context.Context, cache layerfs.CacheRef) (bool, error)
	Inspect(ctx context.Context, cache layerfs.CacheRef) (layerfs.CacheInfo, error)
	End(ctx context.Context, volumeID string, opts layerfs.EndOptions) (layerfs.EndResult, error)
	Sync(ctx context.Context, cache layerfs.CacheRef, chain layerfs.Chain, fetch layerfs.Fetch, opts layerfs.SyncOptions) (layerfs.SyncResult, error)
}

// Harness gives the suite a fresh store and the means to act as a build.
type Harness struct {
	// New returns an empty store; it cleans up with t.Cleanup.
	New func(t *testing.T) Store
	// Write writes content at name (slash-separated, relative to the
	// volume's root) as a build in volume v would.
	Write func(t *testing.T, v *layerfs.Volume, name, content string)
	// Make makes at name (as Write names it) a symlink to a regular
	// file (kind fs.ModeSymlink) or a directory (fs.ModeDir), as a build
	// in volume v would: neither is a control file.
	Make func(t *testing.T, v *layerfs.Volume, name string, kind fs.FileMode)
	// Read returns the content at name in volume v, and whether it
	// exists. Nil skips the checks of what a volume shows.
	Read func(t *testing.T, v *layerfs.Volume, name string) (string, bool)
	// NoSync says the store keeps no layer data and refuses Sync (a fake
	// for tests of decisions): instead of the sync cases, Run checks that
	// Sync fails, so a test that reaches it fails rather than passing on
	// made-up layers.
	NoSync bool
	// Layout is the layout every mount of the suite asks for. The
	// snapshot layout keeps one generation per cache: Run skips the
	// squash case (a squash is a no-op there).
	Layout layerfs.Layout
}

// commitMarker is a control file a build writes to ask for a commit.
const commitMarker = "commit"

var cacheC = layerfs.CacheRef{Namespace: "ns", Name: "c"}

// Run runs every case of the contract against h.
func Run(t *testing.T, h Harness) {
	all := slices.Clone(cases)
	if h.Layout == layerfs.LayoutSnapshot {
		all = slices.DeleteFunc(all, func(c testCase) bool { return c.name == squashCase })
	} else {
		all = append(all, seedCases...)
	}
	all = append(all, endCases()...)
	if h.NoSync {
		all = append(all, testCase{"sync is refused", expectSyncRefused})
	} else {
		all = append(all, syncCases...)
	}
	for _, tc := range all {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, &run{h: h, s: h.New(t), ctx: context.Background()})
		})
	}
}

// run is one case's store and harness.
type run struct {
	h   Harness
	s   Store
	ctx context.Context
}

func (r *run) mount(t *testing.T, id string, opts layerfs.MountOptions) *layerfs.Volume {
	t.Helper()
	if opts.Cache == (layerfs.CacheRef{}) {
		opts.Cache = cacheC
	}
	if opts.Layout == "" {
		opts.Layout = r.h.Layout
	}
	v, err := r.s.Mount(r.ctx, id, opts)
	if err != nil {
		t.Fatalf("Mount %s: %v", id, err)
	}
	return v
}

func (r *run) commit(t *testing.T, id string) layerfs.CommitResult {
	t.Helper()
	res, err := r.s.Commit(r.ctx, id)
	if err != nil {
		t.Fatalf("Commit %s: %v", id, err)
	}
	return res
}

// build mounts a volume of cache c, writes files into it and commits it.
func (r *run) build(t *testing.T, id string, files map[string]string) layerfs.CommitResult {
	t.Helper()
	v := r.mount(t, id, layerfs.MountOptions{})
	for name, content := range files {
		r.h.Write(t, v, name, content)
	}
	return r.commit(t, id)
}

func (r *run) layers(t *testing.T) int {
	t.Helper()
	info, err := r.s.Inspect(r.ctx, cacheC)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return len(info.Layers)
}

// expectShows checks what a fresh volume of cache c shows, if the harness
// can read.
func (r *run) expectShows(t *testing.T, want map[string]string, absent ...string) {
	t.Helper()
	if r.h.Read == nil {
		return
	}
	v := r.mount(t, "view", layerfs.MountOptions{ReadOnly: true})
	defer r.s.Discard(r.ctx, "view")
	for name, content := range want {
		if got, ok := r.h.Read(t, v, name); !ok || got != content {
			t.Errorf("cache shows %s = %q (exists %v), want %q", name, got, ok, content)
		}
	}
	for _, name := range absent {
		if _, ok := r.h.Read(t, v, name); ok {
			t.Errorf("cache shows %s, want it absent", name)
		}
	}
}

func expectNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, layerfs.ErrNotFound) {
		t.Errorf("%s: %v, want ErrNotFound", what, err)
	}
}

// discardFetch is a Fetch for chains whose layers are all local.
func discardFetch(context.Context, layerfs.ChainLayer) (io.ReadCloser, error) {
	return nil, errors.New("the contract's chains need no fetch")
}

var controlCommit = path.Join(layerfs.ControlDir, commitMarker)

// expectSyncRefused checks that a store without layer data refuses Sync.
func expectSyncRefused(t *testing.T, r *run) {
	t.Helper()
	r.build(t, "a", map[string]string{"f": "1"})
	if res, err := r.s.Sync(r.ctx, cacheC, layerfs.Chain{Generation: 1}, discardFetch, layerfs.SyncOptions{}); err == nil {
		t.Errorf("Sync = %+v of a store that keeps no layer data; want an error", res)
	}
}
