package remote

import (
	"context"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/layercache/layercache/remote/registrytest"
)

// pushedCache pushes one layer and tags it latest, as a publish does.
func pushedCache(t *testing.T, tg *Target) (Blob, string) {
	t.Helper()
	ctx := context.Background()
	blob, err := tg.PushLayer(ctx, t.TempDir(), exportOf(layerTar(t, "cache")))
	if err != nil {
		t.Fatal(err)
	}
	digest, err := tg.PushManifest(ctx, []Blob{blob})
	if err != nil {
		t.Fatal(err)
	}
	return blob, digest.String()
}

func TestDeleteManifestUntagsLatestByDigest(t *testing.T) {
	reg := registrytest.New(t)
	ctx := context.Background()
	tg := target(t, reg, Zstd)
	blob, digest := pushedCache(t, tg)
	idx, err := tg.OpenIndex(ctx, blob.Index.String(), blob.IndexSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.PushPrefetch(ctx, blob.Digest.String(), idx, []int{0}); err != nil {
		t.Fatal(err)
	}

	got, err := tg.DeleteManifest(ctx)
	if err != nil || !got.Deleted || got.Digest.String() != digest {
		t.Fatalf("DeleteManifest: %+v, %v; want manifest %s deleted", got, err, digest)
	}
	if _, err := ggcr.Head(tg.Repository.Tag("latest"), tg.options(ggcr.WithContext(ctx))...); !isNotFound(err) {
		t.Errorf("latest after the delete: %v, want 404", err)
	}
	if p, err := tg.FetchPrefetch(ctx, blob.Digest.String(), idx); err != nil || len(p.Frames) != 0 {
		t.Errorf("the layer's prefetch list after the delete: %+v, %v; want it gone with the cache", p, err)
	}
	// The blobs stay until the registry's garbage collection frees them.
	rc, err := tg.FetchCompressed(ctx, blob.Digest.String())
	if err != nil {
		t.Errorf("the layer blob after the manifest's delete: %v; only the registry's GC removes blobs", err)
	} else {
		rc.Close()
	}

	// Racing agents: whoever comes second finds nothing and succeeds.
	again, err := tg.DeleteManifest(ctx)
	if err != nil || again.Deleted {
		t.Errorf("second DeleteManifest: %+v, %v; want nothing to delete, no error", again, err)
	}
	deleted, err := tg.DeleteManifestDigest(ctx, got.Digest)
	if err != nil || deleted {
		t.Errorf("delete of a deleted digest: %v, %v; want false without error (a 404 counts as done)", deleted, err)
	}
	if n := reg.Deletes.Load(); n != 2 {
		t.Errorf("the registry deleted %d manifests, want 2 (latest's and the prefetch list's)", n)
	}
}

func TestDeleteManifestRefusals(t *testing.T) {
	for _, tc := range []struct {
		name         string
		setup        func(*registrytest.Registry)
		password     string
		unsupported  bool
		unauthorized bool
	}{
		{name: "deletes disabled", setup: func(r *registrytest.Registry) { r.SetDeleteRefused(true) }, password: registrytest.Password, unsupported: true},
		{name: "wrong password", setup: func(*registrytest.Registry) {}, password: "wrong", unauthorized: true},
		{name: "registry down", setup: func(r *registrytest.Registry) { r.SetDown(true) }, password: registrytest.Password},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := registrytest.New(t)
			ctx := context.Background()
			pushedCache(t, target(t, reg, Zstd))
			tc.setup(reg)
			tg, err := NewTarget(reg.Host+"/caches/team/maven", Credentials{DockerConfigJSON: reg.DockerConfig(registrytest.User, tc.password), CAPEM: reg.CA}, Zstd)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tg.DeleteManifest(ctx)
			if err == nil || got.Deleted {
				t.Fatalf("DeleteManifest: %+v, %v; want an error", got, err)
			}
			if IsDeleteUnsupported(err) != tc.unsupported || IsUnauthorized(err) != tc.unauthorized {
				t.Errorf("error %v: IsDeleteUnsupported %v (want %v), IsUnauthorized %v (want %v)",
					err, IsDeleteUnsupported(err), tc.unsupported, IsUnauthorized(err), tc.unauthorized)
			}
			if reg.Deletes.Load() != 0 {
				t.Errorf("the registry deleted a manifest")
			}
		})
	}
}
