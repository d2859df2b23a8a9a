package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/registrysync"
	"github.com/layercache/layercache/remote"
)

func testScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	s, err := bootstrap.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newCacheClient is a controller-runtime fake client holding Caches.
func newCacheClient(t testing.TB, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(testScheme(t)).
		WithObjects(objs...).WithStatusSubresource(&v1alpha1.Cache{}).Build()
}

func testMetrics(t testing.TB) *kit.Metrics {
	t.Helper()
	m, err := kit.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testEnv is a provisioner for node-a over a fake store and a fake API.
type testEnv struct {
	prov   *Provisioner
	maint  *Maintainer
	sync   *registrysync.Syncer
	store  *fakeStore
	client client.Client
	events *events.FakeRecorder
}

func newTestEnv(t testing.TB, st kit.Store, objs ...client.Object) *testEnv {
	t.Helper()
	fs, _ := st.(*fakeStore)
	if st == nil {
		fs = newFakeStore()
		st = fs
	}
	c := newCacheClient(t, objs...)
	events := events.NewFakeRecorder(100)
	// The fake store's volumes are nowhere: no mount gate (gate_test.go
	// tests it on a tmpfs of its own).
	core, sync := testNodeParts(t, "node-a", "", st, c, events).build()
	return &testEnv{prov: core.prov, maint: core.maint, sync: sync, store: fs, client: c, events: events}
}

// nodeParts are what a test node's core and registry sync are made of;
// a test may change them before build makes the node.
type nodeParts struct {
	core Config
	sync registrysync.Config
}

// testNodeParts are the parts of node over st and the API c, with the
// node agent's defaults, whose hostname is its name and whose mount gate
// is under root ("" for none); its registry sync trusts no class until a
// test gives it some.
func testNodeParts(t testing.TB, node, root string, st kit.Store, c client.Client, events events.EventRecorder) nodeParts {
	caches := &kit.Caches{Client: c, Reader: c, Node: node}
	m := testMetrics(t)
	reports, squashes, publishes := kit.NewCacheQueue("report", 1), kit.NewCacheQueue("squash", 1), kit.NewCacheQueue("publish", 1)
	return nodeParts{
		core: Config{
			Node: node, Hostname: node, Root: root, Store: st, Caches: caches, Events: events, Metrics: m,
			Reports: reports, Squashes: squashes, Publishes: publishes,
			GC: layerfs.GCOptions{MinFreePercent: 15}, CSILimits: testCSILimits, ResyncInterval: time.Minute,
		},
		sync: registrysync.Config{
			Node: node, Store: st, Caches: caches, Events: events, Metrics: m,
			TmpDir: filepath.Join(t.TempDir(), "tmp"), Compression: remote.DefaultCompression,
			Reports: reports, Squashes: squashes, Publishes: publishes,
		},
	}
}

// build makes the node as the agent does: its registry sync, then its
// core over it.
func (p nodeParts) build() (*Core, *registrysync.Syncer) {
	sync := registrysync.New(p.sync)
	p.core.Sync = sync
	return New(p.core), sync
}

// setStore makes st the store of both parts.
func (p *nodeParts) setStore(st kit.Store) { p.core.Store, p.sync.Store = st, st }

// drainEvents returns the events recorded so far as "Type Reason Message".
func (e *testEnv) drainEvents() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// wantEvent checks that exactly one recorded event starts with prefix
// ("Warning InvalidAnnotation") and contains every substring.
func (e *testEnv) wantEvent(t testing.TB, prefix string, contains ...string) {
	t.Helper()
	events := e.drainEvents()
	var found []string
	for _, ev := range events {
		if strings.HasPrefix(ev, prefix+" ") {
			found = append(found, ev)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one event %q, got events %q", prefix, events)
	}
	for _, c := range contains {
		if !strings.Contains(found[0], c) {
			t.Errorf("event %q does not contain %q", found[0], c)
		}
	}
}

// fakeStore stands in for layerfs.Store in tests of the agent's decisions.
type fakeStore struct {
	mu        sync.Mutex
	volumes   map[string]*layerfs.Volume
	caches    map[layerfs.CacheRef]*layerfs.CacheInfo
	mountOpts map[string]layerfs.MountOptions
	mounts    int
	commits   []string
	discards  []string
	removed   []layerfs.CacheRef
	squashed  []layerfs.CacheRef
	commitErr error
	gcRemoves []layerfs.CacheRef
	maxLayers int
	// control holds the control files each volume's build wrote.
	control map[string][]string
	// torn volumes were mounted when the node went down.
	torn map[string]bool
	// written is how many bytes each volume's build wrote; a new volume
	// starts with buildWrites: the agent's tests assume builds write
	// unless they say otherwise, the store contract starts from nothing.
	written     map[string]int64
	buildWrites int64
}

func newFakeStore() *fakeStore {
	return &fakeStore{
		volumes:   map[string]*layerfs.Volume{},
		caches:    map[layerfs.CacheRef]*layerfs.CacheInfo{},
		mountOpts: map[string]layerfs.MountOptions{},
		maxLayers: 2,
		control:   map[string][]string{},
		torn:      map[string]bool{},
		written:   map[string]int64{},
		// buildWrites: the 100 bytes every fake commit reports.
		buildWrites: 100,
	}
}

func (s *fakeStore) cache(ref layerfs.CacheRef) *layerfs.CacheInfo {
	c, ok := s.caches[ref]
	if !ok {
		c = &layerfs.CacheInfo{Cache: ref}
		s.caches[ref] = c
	}
	return c
}

func (s *fakeStore) Mount(_ context.Context, id string, opts layerfs.MountOptions) (*layerfs.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mounts++
	if v, ok := s.volumes[id]; ok {
		if v.Cache != opts.Cache {
			return nil, fmt.Errorf("volume %q belongs to cache %s, not %s", id, v.Cache, opts.Cache)
		}
		v.Mounted = true
		c := *v
		return &c, nil
	}
	v := &layerfs.Volume{
		ID: id, Cache: opts.Cache, ReadOnly: opts.ReadOnly, Writer: opts.Writer, Labels: opts.Labels,
		MergedPath: "/fake/volumes/" + id + "/merged", Mounted: true,
	}
	s.volumes[id] = v
	s.mountOpts[id] = opts
	if _, ok := s.written[id]; !ok {
		s.written[id] = s.buildWrites
	}
	if seed := s.seedFor(opts); seed != nil {
		// As the store: a seeded volume leaves its cache alone until
		// its commit creates it.
		v.SeededFrom = &layerfs.Seed{Cache: seed.Cache, Generation: seed.Generation}
		v.Layers = layerIDs(seed.Layers)
		out := *v
		return &out, nil
	}
	c := s.cache(opts.Cache)
	c.LastUsed = time.Now()
	v.BaseGeneration = c.Generation
	c.Volumes = append(c.Volumes, id)
	out := *v
	return &out, nil
}

// seedFor is the first of opts' fallbacks with a generation, if the cache
// has none (layerfs.MountOptions.Fallbacks).
func (s *fakeStore) seedFor(opts layerfs.MountOptions) *layerfs.CacheInfo {
	if c, ok := s.caches[opts.Cache]; ok && c.Generation > 0 {
		return nil
	}
	for _, f := range opts.Fallbacks {
		if c, ok := s.caches[f]; ok && f != opts.Cache && c.Generation > 0 {
			return c
		}
	}
	return nil
}

func layerIDs(layers []layerfs.LayerInfo) []string {
	ids := make([]string, len(layers))
	for i, l := range layers {
		ids[i] = l.ID
	}
	return ids
}

func (s *fakeStore) Commit(_ context.Context, id string) (layerfs.CommitResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volumes[id]
	if !ok {
		return layerfs.CommitResult{}, fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	if v.ReadOnly {
		return layerfs.CommitResult{}, errors.New("read-only volume")
	}
	if s.commitErr != nil {
		return layerfs.CommitResult{}, s.commitErr
	}
	if limit := s.mountOpts[id].LimitBytes; limit > 0 && s.written[id] > limit {
		delete(s.volumes, id)
		s.discards = append(s.discards, id)
		return layerfs.CommitResult{Cache: v.Cache, OverLimit: true, Bytes: s.written[id], Generation: s.cache(v.Cache).Generation}, nil
	}
	if s.torn[id] {
		delete(s.volumes, id)
		s.discards = append(s.discards, id)
		return layerfs.CommitResult{Cache: v.Cache, Torn: true, Generation: s.cache(v.Cache).Generation}, nil
	}
	s.commits = append(s.commits, id)
	delete(s.volumes, id)
	var seeded *layerfs.Seed
	c, ok := s.caches[v.Cache]
	switch {
	case v.SeededFrom != nil && s.written[id] == 0:
		return layerfs.CommitResult{Cache: v.Cache}, nil // creates nothing
	case v.SeededFrom != nil && (!ok || c.Generation == 0):
		// Created on the fallback's layers as they were at the mount.
		c = s.cache(v.Cache)
		for _, l := range v.Layers {
			c.Layers = append(c.Layers, layerfs.LayerInfo{ID: l, Bytes: 100})
			c.Bytes += 100
		}
		seeded, c.SeededFrom = v.SeededFrom, v.SeededFrom
	case !ok:
		return layerfs.CommitResult{Cache: v.Cache, Dropped: true}, nil
	}
	c.Volumes = without(c.Volumes, id)
	if s.written[id] == 0 {
		return layerfs.CommitResult{Cache: v.Cache, Generation: c.Generation}, nil
	}
	c.Generation++
	c.Layers = append([]layerfs.LayerInfo{{ID: fmt.Sprintf("l%d", c.Generation), Bytes: 100}}, c.Layers...)
	c.Bytes += 100
	c.LastWriter = v.Writer
	return layerfs.CommitResult{Cache: v.Cache, Generation: c.Generation, Layer: c.Layers[0].ID, Bytes: 100, NeedsSquash: len(c.Layers) > s.maxLayers, SeededFrom: seeded}, nil
}

func without(ids []string, id string) []string {
	var out []string
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

func (s *fakeStore) Discard(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volumes[id]
	if !ok {
		return fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	s.discards = append(s.discards, id)
	delete(s.volumes, id)
	if c, ok := s.caches[v.Cache]; ok {
		c.Volumes = without(c.Volumes, id)
	}
	return nil
}

func (s *fakeStore) Volume(_ context.Context, id string) (*layerfs.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volumes[id]
	if !ok {
		return nil, fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	c := *v
	return &c, nil
}

func (s *fakeStore) Volumes(context.Context) ([]layerfs.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var vols []layerfs.Volume
	for _, v := range s.volumes {
		vols = append(vols, *v)
	}
	return vols, nil
}

func (s *fakeStore) HasControlFile(_ context.Context, id, name string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.volumes[id]; !ok {
		return false, fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	return slices.Contains(s.control[id], name), nil
}

func (s *fakeStore) Squash(_ context.Context, ref layerfs.CacheRef, maxLayers int) (layerfs.SquashResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.squashed = append(s.squashed, ref)
	c, ok := s.caches[ref]
	if !ok || len(c.Layers) <= maxLayers {
		return layerfs.SquashResult{}, nil
	}
	res := layerfs.SquashResult{Squashed: true, Layer: c.Layers[0].ID + "-squashed", OldLayers: len(c.Layers)}
	c.Layers = []layerfs.LayerInfo{{ID: res.Layer, Bytes: c.Bytes}}
	return res, nil
}

func (s *fakeStore) GC(_ context.Context, _ layerfs.GCOptions) (layerfs.GCResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ref := range s.gcRemoves {
		delete(s.caches, ref)
	}
	return layerfs.GCResult{RemovedCaches: s.gcRemoves}, nil
}

func (s *fakeStore) Remove(_ context.Context, ref layerfs.CacheRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.caches[ref]; !ok {
		return fmt.Errorf("cache %s: %w", ref, layerfs.ErrNotFound)
	}
	delete(s.caches, ref)
	s.removed = append(s.removed, ref)
	return nil
}

// RemoveIfUnused keeps caches a writable volume uses, as the store does.
func (s *fakeStore) RemoveIfUnused(ctx context.Context, ref layerfs.CacheRef) (bool, error) {
	s.mu.Lock()
	c, ok := s.caches[ref]
	if !ok {
		s.mu.Unlock()
		return false, nil
	}
	for _, id := range c.Volumes {
		if v := s.volumes[id]; v != nil && !v.ReadOnly {
			s.mu.Unlock()
			return false, nil
		}
	}
	s.mu.Unlock()
	return true, s.Remove(ctx, ref)
}

func (s *fakeStore) List(_ context.Context) ([]layerfs.CacheInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []layerfs.CacheInfo
	for _, c := range s.caches {
		out = append(out, *c)
	}
	return out, nil
}

func (s *fakeStore) Inspect(_ context.Context, ref layerfs.CacheRef) (layerfs.CacheInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.caches[ref]
	if !ok {
		return layerfs.CacheInfo{}, fmt.Errorf("cache %s: %w", ref, layerfs.ErrNotFound)
	}
	return *c, nil
}

func (s *fakeStore) Recover(context.Context) (layerfs.RecoverResult, error) {
	return layerfs.RecoverResult{}, nil
}

// metricValue reads a counter or gauge.
func metricValue(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	switch {
	case out.Counter != nil:
		return out.Counter.GetValue()
	case out.Gauge != nil:
		return out.Gauge.GetValue()
	}
	t.Fatalf("metric %v is neither counter nor gauge", m.Desc())
	return 0
}

func (s *fakeStore) committed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.commits...)
}

func (s *fakeStore) mountCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mounts
}

func clientKey(ref layerfs.CacheRef) client.ObjectKey {
	return client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}
}

var errFakeStoreSync = errors.New("fakeStore keeps no layer data; sync tests use a real store")

func (s *fakeStore) ExportLayer(context.Context, layerfs.CacheRef, string, io.Writer) error {
	return errFakeStoreSync
}

func (s *fakeStore) SetLayerDigest(context.Context, layerfs.CacheRef, string, string) error {
	return errFakeStoreSync
}

func (s *fakeStore) Sync(context.Context, layerfs.CacheRef, layerfs.Chain, layerfs.Fetch, layerfs.SyncOptions) (layerfs.SyncResult, error) {
	return layerfs.SyncResult{}, errFakeStoreSync
}

func (s *fakeStore) HasChanges(_ context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.volumes[id]; !ok {
		return false, fmt.Errorf("volume %q: %w", id, layerfs.ErrNotFound)
	}
	return s.written[id] > 0, nil
}
