package remote

import (
	"bytes"
	"context"
	"io"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/layercache/layercache/remote/registrytest"
)

func targetAt(t *testing.T, reg *registrytest.Registry, repo string) *Target {
	t.Helper()
	tg, err := NewTarget(reg.Host+"/"+repo, Credentials{DockerConfigJSON: reg.DockerConfig(registrytest.User, registrytest.Password), CAPEM: reg.CA}, Zstd)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// fetchAll reads the layer back from tg, verified.
func fetchAll(t *testing.T, tg *Target, b Blob) []byte {
	t.Helper()
	rc, err := tg.Fetch(context.Background(), b.Digest.String(), b.Size)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("fetch %s from %s: %v", b.Digest, tg, err)
	}
	return got
}

func TestMountBlob(t *testing.T) {
	for _, tc := range []struct {
		name       string
		refuse     bool // the registry answers mounts with an upload session
		otherHost  bool // the source is another registry
		corrupt    bool // the source serves the wrong bytes
		want       string
		wantMount  int // POSTs with mount= answered 201 (the layer's and its index's)
		wantErrHas string
	}{
		{name: "mounted", want: Mounted, wantMount: 2},
		{name: "refused, copied", refuse: true, want: Copied},
		{name: "other registry, copied", otherHost: true, want: Copied},
		{name: "other registry, corrupt source", otherHost: true, corrupt: true, wantErrHas: "copy blob"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			src := registrytest.New(t)
			dst := src
			if tc.otherHost {
				dst = registrytest.New(t)
			}
			from := targetAt(t, src, "caches/team/main")
			to := targetAt(t, dst, "caches/team/pr-1")
			want := layerTar(t, strings.Repeat("main ", 500))
			blob, err := from.PushLayer(ctx, t.TempDir(), exportOf(want))
			if err != nil {
				t.Fatal(err)
			}
			dst.SetRefuseMounts(tc.refuse)
			src.SetCorrupt(tc.corrupt)
			before := len(dst.Log())

			how, err := to.MountBlob(ctx, from, blob)
			if tc.wantErrHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrHas) {
					t.Fatalf("MountBlob = %q, %v; want an error with %q", how, err, tc.wantErrHas)
				}
				return
			}
			if err != nil || how != tc.want {
				t.Fatalf("MountBlob = %q, %v; want %q", how, err, tc.want)
			}
			if got := fetchAll(t, to, blob); !bytes.Equal(got, want) {
				t.Errorf("the blob in %s is not the layer pushed to %s", to, from)
			}
			// A seeded cache's layer stays readable by range.
			if idx, err := to.OpenIndex(ctx, blob.Index.String(), blob.IndexSize); err != nil || idx.ImageBytes != int64(len(want)) {
				t.Errorf("OpenIndex in %s = %+v, %v; want the index of the %d-byte layer", to, idx, err, len(want))
			}
			log := dst.Log()[before:]
			mounts := 0
			for _, d := range []string{blob.Digest.String(), blob.Index.String()} {
				mountPost := "POST /v2/caches/team/pr-1/blobs/uploads/?" + url.Values{"from": {"caches/team/main"}, "mount": {d}}.Encode()
				for _, l := range log {
					if strings.HasPrefix(l, mountPost+" 201") {
						mounts++
					}
				}
			}
			if mounts != tc.wantMount {
				t.Errorf("%d mounts answered 201, want %d; log:\n%s", mounts, tc.wantMount, strings.Join(log, "\n"))
			}
			if tc.want == Mounted && slices.ContainsFunc(log, func(l string) bool { return strings.HasPrefix(l, "PUT ") || strings.HasPrefix(l, "PATCH ") }) {
				t.Errorf("a mounted blob was uploaded too; log:\n%s", strings.Join(log, "\n"))
			}
		})
	}
}
