package remote

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/layercache/layercache/remote/registrytest"
)

// TestPrefetchRoundTrip: a layer has no prefetch list until one is
// pushed; the list read back is the one pushed, and pushing again
// replaces it.
func TestPrefetchRoundTrip(t *testing.T) {
	ctx := context.Background()
	tg := target(t, registrytest.New(t), Zstd)
	_, blob, idx := pushSeekable(t, tg)
	layer := blob.Digest.String()

	got, err := tg.FetchPrefetch(ctx, layer, idx)
	if err != nil || len(got.Frames) != 0 {
		t.Fatalf("a layer without a list: %+v, %v; want an empty list", got, err)
	}
	for _, frames := range [][]int{{3, 0, 5}, {1}} {
		want := Prefetch{FrameBytes: idx.FrameBytes, Frames: frames}
		if err := tg.PushPrefetch(ctx, layer, idx, frames); err != nil {
			t.Fatal(err)
		}
		got, err := tg.FetchPrefetch(ctx, layer, idx)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("read back %+v, %v; want %+v", got, err, want)
		}
	}
}

// TestPrefetchIsChecked: a list is refused when it is pushed, and
// ignored with an error when it is read, unless it fits the layer's
// index: its frame size, each frame once and within the image.
func TestPrefetchIsChecked(t *testing.T) {
	ctx := context.Background()
	tg := target(t, registrytest.New(t), Zstd)
	_, blob, idx := pushSeekable(t, tg)
	frames := len(idx.Frames)
	for _, tc := range []struct {
		name string
		p    Prefetch
		want string
	}{
		{"another frame size", Prefetch{FrameBytes: idx.FrameBytes / 2, Frames: []int{0}}, "frames are of"},
		{"out of the image", Prefetch{FrameBytes: idx.FrameBytes, Frames: []int{frames}}, "out of the layer's"},
		{"negative", Prefetch{FrameBytes: idx.FrameBytes, Frames: []int{-1}}, "out of the layer's"},
		{"repeated", Prefetch{FrameBytes: idx.FrameBytes, Frames: []int{1, 1}}, "repeated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.p.check(idx.FrameBytes, frames); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("check(%+v) = %v, want %q", tc.p, err, tc.want)
			}
		})
	}
	if err := tg.PushPrefetch(ctx, blob.Digest.String(), idx, []int{frames}); err == nil {
		t.Errorf("pushed a list with frame %d of a layer of %d frames", frames, frames)
	}
	// A list pushed for a layer of more frames does not fit this one.
	big := &Index{FrameBytes: idx.FrameBytes, Frames: make([]Frame, 2*frames)}
	p := Prefetch{FrameBytes: idx.FrameBytes, Frames: []int{2*frames - 1}}
	if err := tg.PushPrefetch(ctx, blob.Digest.String(), big, p.Frames); err != nil {
		t.Fatal(err)
	}
	if got, err := tg.FetchPrefetch(ctx, blob.Digest.String(), idx); err == nil {
		t.Errorf("read a list with frame %d of a layer of %d frames: %+v", 2*frames-1, frames, got)
	}
	if _, err := tg.FetchPrefetch(ctx, "sha256:nothex", idx); err == nil {
		t.Error("read the list of an invalid digest")
	}
}
