package storetest

import (
	"testing"

	"github.com/layercache/layercache/layerfs"
)

var (
	cacheMain    = layerfs.CacheRef{Namespace: "ns", Name: "main"}
	cacheMissing = layerfs.CacheRef{Namespace: "ns", Name: "missing"}
)

// seedCases need the overlay layout: a snapshot cache cannot start from
// a fallback yet (layerfs.MountOptions.Fallbacks).
var seedCases = []testCase{
	{"a cache with no generation starts from its first existing fallback", func(t *testing.T, r *run) {
		main := r.mount(t, "m", layerfs.MountOptions{Cache: cacheMain})
		r.h.Write(t, main, "f", "main")
		r.h.Write(t, main, "g", "main")
		r.commit(t, "m")

		fallbacks := []layerfs.CacheRef{cacheMissing, cacheMain}
		v := r.mount(t, "v", layerfs.MountOptions{Fallbacks: fallbacks})
		if want := (layerfs.Seed{Cache: cacheMain, Generation: 1}); v.SeededFrom == nil || *v.SeededFrom != want || v.BaseGeneration != 0 {
			t.Fatalf("Mount = %+v, want seeded from %v at base generation 0", v, want)
		}
		r.expectVolumeShows(t, v, map[string]string{"f": "main", "g": "main"})
		r.h.Write(t, v, "g", "pr")
		res := r.commit(t, "v")
		if res.Generation != 1 || res.Layer == "" || res.SeededFrom == nil || res.SeededFrom.Cache != cacheMain {
			t.Fatalf("seeded Commit = %+v, want generation 1 seeded from %s", res, cacheMain)
		}
		info, err := r.s.Inspect(r.ctx, cacheC)
		if err != nil || info.SeededFrom == nil || len(info.Layers) != 2 {
			t.Fatalf("Inspect = %+v, %v; want main's layer and the new one, seeded from %s", info, err, cacheMain)
		}
		r.expectShows(t, map[string]string{"f": "main", "g": "pr"})
		if m, err := r.s.Inspect(r.ctx, cacheMain); err != nil || m.Generation != 1 || len(m.Layers) != 1 {
			t.Errorf("fallback after the seeded commit = %+v, %v; want unchanged", m, err)
		}
		// Once the cache exists its fallbacks are ignored.
		if again := r.mount(t, "w", layerfs.MountOptions{Fallbacks: fallbacks}); again.SeededFrom != nil || again.BaseGeneration != 1 {
			t.Errorf("Mount of the existing cache = %+v, want its own generation 1, not seeded", again)
		}
	}},
	{"a discarded seeded volume creates nothing", func(t *testing.T, r *run) {
		main := r.mount(t, "m", layerfs.MountOptions{Cache: cacheMain})
		r.h.Write(t, main, "f", "main")
		r.commit(t, "m")
		v := r.mount(t, "v", layerfs.MountOptions{Fallbacks: []layerfs.CacheRef{cacheMain}})
		r.h.Write(t, v, "f", "pr")
		if err := r.s.Discard(r.ctx, "v"); err != nil {
			t.Fatal(err)
		}
		_, err := r.s.Inspect(r.ctx, cacheC)
		expectNotFound(t, "Inspect after the seeded volume's discard", err)
	}},
}

// expectVolumeShows checks what volume v shows, if the harness can read.
func (r *run) expectVolumeShows(t *testing.T, v *layerfs.Volume, want map[string]string) {
	t.Helper()
	if r.h.Read == nil {
		return
	}
	for name, content := range want {
		if got, ok := r.h.Read(t, v, name); !ok || got != content {
			t.Errorf("volume %s shows %s = %q (exists %v), want %q", v.ID, name, got, ok, content)
		}
	}
}
