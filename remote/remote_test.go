package remote

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcr "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/klauspost/compress/zstd"

	"github.com/layercache/layercache/remote/registrytest"
)

func target(t *testing.T, reg *registrytest.Registry, c Compression) *Target {
	t.Helper()
	tg, err := NewTarget(reg.Host+"/caches/team/maven", Credentials{DockerConfigJSON: reg.DockerConfig(registrytest.User, registrytest.Password), CAPEM: reg.CA}, c)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// layerTar is a small OCI layer with a whiteout.
func layerTar(t *testing.T, content string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := map[string]string{"dir/file": content, "dir/.wh.gone": ""}
	for _, name := range []string{"dir/file", "dir/.wh.gone"} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, files[name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func exportOf(b []byte) Export {
	return func(w io.Writer) error { _, err := w.Write(b); return err }
}

func TestPushFetchRoundTrip(t *testing.T) {
	reg := registrytest.New(t)
	for _, c := range []Compression{Zstd, Gzip} {
		t.Run(string(c), func(t *testing.T) {
			ctx := context.Background()
			tg := target(t, reg, c)
			want := layerTar(t, strings.Repeat("cache ", 1000)+string(c))
			blob, err := tg.PushLayer(ctx, t.TempDir(), exportOf(want))
			if err != nil {
				t.Fatal(err)
			}
			if blob.ImageBytes != int64(len(want)) || blob.Size <= 0 || blob.Size >= blob.ImageBytes {
				t.Errorf("blob %+v: want ImageBytes %d and a smaller compressed size", blob, len(want))
			}
			again, err := tg.PushLayer(ctx, t.TempDir(), exportOf(want))
			if err != nil || again.Digest != blob.Digest {
				t.Errorf("second push of the same layer: digest %s (first %s), err %v; exports are deterministic, so pushes must be too", again.Digest, blob.Digest, err)
			}
			if got := fetchWhole(t, tg, blob); !bytes.Equal(got, want) {
				t.Errorf("fetched %d bytes, pushed %d: not the same tar", len(got), len(want))
			}
		})
	}
}

// The manifest lists the chain base first, then the index blobs of the
// layers that have one (not of a layer pushed as one stream), so that
// registry garbage collection keeps them.
func TestPushManifestListsTheChainBaseFirst(t *testing.T) {
	reg := registrytest.New(t)
	ctx := context.Background()
	tg := target(t, reg, Zstd)
	var chain []Blob
	for i, push := range []func(context.Context, string, Export) (Blob, error){tg.PushLayer, tg.PushStream, tg.PushLayer} {
		b, err := push(ctx, t.TempDir(), exportOf(layerTar(t, fmt.Sprint("generation ", i))))
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, b)
	}
	if chain[1].Index != (v1.Hash{}) || chain[0].Index == (v1.Hash{}) || chain[2].Index == (v1.Hash{}) {
		t.Fatalf("chain %+v: want indexes on the seekable layers 0 and 2 only", chain)
	}
	digest, err := tg.PushManifest(ctx, chain)
	if err != nil {
		t.Fatal(err)
	}
	img, err := ggcr.Image(tg.Repository.Tag("latest"), tg.options(ggcr.WithContext(ctx))...)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := img.Digest(); err != nil || got != digest {
		t.Errorf("latest names manifest %s (%v), PushManifest returned %s", got, err, digest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	want := []v1.Descriptor{
		{MediaType: chain[0].MediaType, Digest: chain[0].Digest, Size: chain[0].Size},
		{MediaType: chain[1].MediaType, Digest: chain[1].Digest, Size: chain[1].Size},
		{MediaType: chain[2].MediaType, Digest: chain[2].Digest, Size: chain[2].Size},
		{MediaType: MediaTypeIndex, Digest: chain[0].Index, Size: chain[0].IndexSize},
		{MediaType: MediaTypeIndex, Digest: chain[2].Index, Size: chain[2].IndexSize},
	}
	wantDiffIDs := []v1.Hash{chain[0].DiffID, chain[1].DiffID, chain[2].DiffID, chain[0].Index, chain[2].Index}
	if len(m.Layers) != len(want) || len(cfg.RootFS.DiffIDs) != len(wantDiffIDs) {
		t.Fatalf("manifest has %d layers and config %d diff IDs, want %d and %d", len(m.Layers), len(cfg.RootFS.DiffIDs), len(want), len(wantDiffIDs))
	}
	for i, w := range want {
		got := m.Layers[i]
		if got.MediaType != w.MediaType || got.Digest != w.Digest || got.Size != w.Size || cfg.RootFS.DiffIDs[i] != wantDiffIDs[i] {
			t.Errorf("manifest entry %d: %s %s (%d bytes), diff ID %s; want %s %s (%d bytes), diff ID %s",
				i, got.MediaType, got.Digest, got.Size, cfg.RootFS.DiffIDs[i], w.MediaType, w.Digest, w.Size, wantDiffIDs[i])
		}
	}
}

func TestFetchVerifiesTheDigest(t *testing.T) {
	reg := registrytest.New(t)
	ctx := context.Background()
	tg := target(t, reg, Gzip)
	blob, err := tg.PushLayer(ctx, t.TempDir(), exportOf(layerTar(t, "real")))
	if err != nil {
		t.Fatal(err)
	}
	reg.SetCorrupt(true)
	rc, err := tg.Fetch(ctx, blob.Digest.String(), blob.Size)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if err == nil {
		t.Fatal("a blob whose bytes do not match its digest was read without error")
	}
}

// A registry that sends more than the chain states is cut off there, not
// read to its end: a hostile one could stream forever.
func TestFetchStopsPastTheStatedSize(t *testing.T) {
	reg := registrytest.New(t)
	ctx := context.Background()
	tg := target(t, reg, Zstd)
	blob, err := tg.PushLayer(ctx, t.TempDir(), exportOf(layerTar(t, strings.Repeat("cache ", 1000))))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := tg.Fetch(ctx, blob.Digest.String(), blob.Size-10)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("fetch of a %d-byte blob bounded at %d: %v, want an error that says it is longer", blob.Size, blob.Size-10, err)
	}
}

// A zstd frame declares the window its decoder must keep; a 37 KB blob
// declaring 512 MiB would take 512 MiB of the agent's memory.
func TestZstdWindowIsBounded(t *testing.T) {
	for _, tc := range []struct {
		window  int
		wantErr bool
	}{{encoderWindow, false}, {512 << 20, true}} {
		var buf bytes.Buffer
		zw, err := zstd.NewWriter(&buf, zstd.WithWindowSize(tc.window), zstd.WithSingleSegment(false))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := zw.Write(bytes.Repeat([]byte("x"), 1<<20)); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		rc, err := decompress(io.NopCloser(&buf))
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		if (err != nil) != tc.wantErr {
			t.Errorf("a blob with a %d-byte window: %v, want error %v", tc.window, err, tc.wantErr)
		}
	}
}

func TestBadCredentialsAreUnauthorized(t *testing.T) {
	reg := registrytest.New(t)
	tg, err := NewTarget(reg.Host+"/caches/team/maven", Credentials{DockerConfigJSON: reg.DockerConfig(registrytest.User, "wrong"), CAPEM: reg.CA}, Zstd)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tg.PushLayer(context.Background(), t.TempDir(), exportOf(layerTar(t, "x")))
	if !IsUnauthorized(err) {
		t.Errorf("push with a wrong password: %v, want an error that IsUnauthorized", err)
	}
	var terr *transport.Error
	if !errors.As(err, &terr) {
		t.Errorf("error %v does not carry the registry's answer", err)
	}
}

func TestNewTargetErrors(t *testing.T) {
	for _, tc := range []struct {
		name, repo string
		creds      Credentials
		c          Compression
		want       string
	}{
		{"bad repository", "Registry.Example/UPPER", Credentials{}, Zstd, "is not valid"},
		{"unknown compression", "reg.example:5000/caches/a/b", Credentials{}, "lz4", `compression "lz4"`},
		{"bad docker config", "reg.example:5000/caches/a/b", Credentials{DockerConfigJSON: []byte("{")}, Zstd, "docker config JSON is not valid"},
		{"no entry for the registry", "reg.example:5000/caches/a/b", Credentials{DockerConfigJSON: []byte(`{"auths":{"other.example":{"auth":"eDp5"}}}`)}, Zstd, "no credentials for registry reg.example:5000"},
		{"CA without a certificate", "reg.example:5000/caches/a/b", Credentials{CAPEM: []byte("nope")}, Zstd, "holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewTarget(tc.repo, tc.creds, tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewTarget: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// fetchWhole fetches blob's whole image, as a node pulls it.
func fetchWhole(t *testing.T, tg *Target, blob Blob) []byte {
	t.Helper()
	rc, err := tg.Fetch(context.Background(), blob.Digest.String(), blob.Size)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return got
}
