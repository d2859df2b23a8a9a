package registrysync

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/remote"
	"github.com/layercache/layercache/remote/registrytest"
)

// pushedLayer pushes image as a zstd layer of a repository of reg and
// returns the target and the chain layer a Sync would be given for it.
func pushedLayer(t *testing.T, reg *registrytest.Registry, image []byte) (*remote.Target, layerfs.ChainLayer) {
	t.Helper()
	target, err := remote.NewTarget(reg.Host+"/caches/ci/maven", remote.Credentials{
		DockerConfigJSON: reg.DockerConfig(registrytest.User, registrytest.Password), CAPEM: reg.CA}, remote.Zstd)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := target.PushLayer(context.Background(), t.TempDir(), func(w io.Writer) error { _, err := w.Write(image); return err })
	if err != nil {
		t.Fatal(err)
	}
	l := publishedLayer(blob)
	l.Generation = 1
	return target, chainOf(&v1alpha1.PublishedChain{Generation: 1, Layers: []v1alpha1.PublishedLayer{l}}).Layers[0]
}

// someImage is n bytes that compress a little, as an image does.
func someImage(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.IntN(16))
	}
	return b
}

func TestOpenLazyFrom(t *testing.T) {
	reg := registrytest.New(t)
	image := someImage(2*remote.FrameBytes + 1000) // three frames, the last short
	target, layer := pushedLayer(t, reg, image)
	for _, tc := range []struct {
		name     string
		bound    int64
		change   func(*layerfs.ChainLayer)
		tooLarge bool
		wantErr  string
	}{
		{name: "no bound"},
		{name: "within the bound", bound: int64(len(image))},
		{name: "image over the bound", bound: int64(len(image)) - 1, tooLarge: true},
		{name: "no index", change: func(l *layerfs.ChainLayer) { l.Index, l.IndexSize = "", 0 }, wantErr: "cannot be read by range"},
		{name: "index longer than the chain states", change: func(l *layerfs.ChainLayer) { l.IndexSize -= 10 }, wantErr: "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			l := layer
			if tc.change != nil {
				tc.change(&l)
			}
			src, err := openLazyFrom(target, &kit.RegistryRef{MaxLayerBytes: tc.bound})(ctx, maven, l)
			switch {
			case tc.tooLarge:
				if !errors.Is(err, layerfs.ErrTooLarge) {
					t.Fatalf("open = %v, want ErrTooLarge", err)
				}
				return
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("open = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if src.ImageBytes != int64(len(image)) || src.ChunkBytes != remote.FrameBytes {
				t.Errorf("source of %d bytes in chunks of %d, want %d in %d", src.ImageBytes, src.ChunkBytes, len(image), remote.FrameBytes)
			}
			// A range across a frame boundary, and the image's tail.
			for _, r := range [][2]int64{{remote.FrameBytes - 100, 300}, {int64(len(image)) - 50, 50}} {
				rc, err := src.Fetch(ctx, r[0], r[1])
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || !bytes.Equal(got, image[r[0]:r[0]+r[1]]) {
					t.Errorf("Fetch(%d, %d) = %d bytes, %v; not the image's bytes there", r[0], r[1], len(got), err)
				}
			}
		})
	}
}

// With the class's mountFirst, a Sync mounts layers with an index at
// once, and a read waits for missing bytes as long as a claim waits for
// its layers; without it, layers are fetched whole.
func TestSyncOptions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mountFirst bool
	}{{"mount first", true}, {"fetch first", false}} {
		t.Run(tc.name, func(t *testing.T) {
			bounds := &kit.RegistryRef{MaxLayerBytes: 20 << 30, SyncTimeout: 90 * time.Second, MountFirst: tc.mountFirst}
			opts := syncOptions(nil, bounds)
			if opts.MaxLayerBytes != bounds.MaxLayerBytes {
				t.Errorf("MaxLayerBytes = %d, want %d", opts.MaxLayerBytes, bounds.MaxLayerBytes)
			}
			if (opts.OpenLazy != nil) != tc.mountFirst {
				t.Errorf("OpenLazy set = %v, want %v", opts.OpenLazy != nil, tc.mountFirst)
			}
			if want := map[bool]time.Duration{true: bounds.SyncTimeout}[tc.mountFirst]; opts.LazyWait != want {
				t.Errorf("LazyWait = %s, want %s", opts.LazyWait, want)
			}
		})
	}
}

// After a restart, a layer is read by range again only while the chain
// lists it with the index it was mounted with.
func TestStillListed(t *testing.T) {
	d := func(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }
	pub := &v1alpha1.PublishedChain{Generation: 2, Layers: []v1alpha1.PublishedLayer{
		{Digest: d('b'), Size: 10, Generation: 2, Index: d('c'), IndexSize: 140},
		{Digest: d('a'), Size: 10, Generation: 1},
	}}
	for _, tc := range []struct {
		name  string
		layer layerfs.ChainLayer
		want  string // "" when listed
	}{
		{"listed", layerfs.ChainLayer{Digest: d('b'), Index: d('c'), IndexSize: 140}, ""},
		{"another index", layerfs.ChainLayer{Digest: d('b'), Index: d('e'), IndexSize: 140}, "not the"},
		{"another index size", layerfs.ChainLayer{Digest: d('b'), Index: d('c'), IndexSize: 141}, "not the"},
		{"gone from the chain", layerfs.ChainLayer{Digest: d('f'), Index: d('c'), IndexSize: 140}, "no longer lists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := stillListed(maven, pub, tc.layer)
			if (tc.want == "") != (err == nil) || (err != nil && (!strings.Contains(err.Error(), tc.want) || !errors.Is(err, layerfs.ErrNotFound))) {
				t.Errorf("stillListed = %v, want ErrNotFound containing %q", err, tc.want)
			}
		})
	}
}

// TestOpenLazyPrefetch: a layer without a prefetch list is opened to
// record one (the reads of this node's builds); once one is stored, the
// next node is given it to fetch first, and records none.
func TestOpenLazyPrefetch(t *testing.T) {
	ctx := context.Background()
	target, layer := pushedLayer(t, registrytest.New(t), someImage(3*remote.FrameBytes))
	open := openLazyFrom(target, &kit.RegistryRef{})
	first, err := open(ctx, maven, layer)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Prefetch) != 0 || first.RecordReads == nil {
		t.Fatalf("first node: prefetch %v, records %v; want no list, and one to record", first.Prefetch, first.RecordReads != nil)
	}
	if err := first.RecordReads(ctx, []int{2, 0}); err != nil {
		t.Fatal(err)
	}
	next, err := open(ctx, maven, layer)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(next.Prefetch, []int{2, 0}) || next.RecordReads != nil {
		t.Errorf("next node: prefetch %v, records %v; want [2 0], and nothing to record", next.Prefetch, next.RecordReads != nil)
	}
	if err := first.RecordReads(ctx, []int{3}); err == nil {
		t.Error("stored a list with a frame past the layer's three")
	}
}
