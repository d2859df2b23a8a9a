package imagebuild

import (
	"archive/tar"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/layercache/layercache/remote/registrytest"
)

func TestSpecValidate(t *testing.T) {
	bin := File{Path: "/app", IsData: true, Data: []byte("x")}
	tests := []struct {
		name    string
		spec    Spec
		wantErr string
	}{
		{name: "ok", spec: Spec{Ref: "localhost/app:dev", Entrypoint: []string{"/app"}, Files: []File{bin}}},
		{name: "bad ref", spec: Spec{Ref: "Upper/Case:x", Files: []File{bin}}, wantErr: "image reference"},
		{name: "no files", spec: Spec{Ref: "localhost/app:dev"}, wantErr: "no files"},
		{name: "relative path", spec: Spec{Ref: "localhost/app:dev", Files: []File{{Path: "app", IsData: true}}}, wantErr: "absolute"},
		{name: "unclean path", spec: Spec{Ref: "localhost/app:dev", Files: []File{{Path: "/a/../app", IsData: true}}}, wantErr: "absolute and clean"},
		{name: "two contents", spec: Spec{Ref: "localhost/app:dev", Files: []File{{Path: "/app", IsData: true, Link: "/x"}}}, wantErr: "more than one"},
		{name: "duplicate", spec: Spec{Ref: "localhost/app:dev", Files: []File{bin, bin}}, wantErr: "twice"},
		{name: "missing entrypoint", spec: Spec{Ref: "localhost/app:dev", Entrypoint: []string{"/bin/sh"}, Files: []File{bin}}, wantErr: "entrypoint /bin/sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tool")
	if err := os.WriteFile(src, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{
		Ref:        "localhost/tool:dev",
		Entrypoint: []string{"/usr/bin/tool"},
		Env:        []string{"PATH=/usr/bin"},
		Files: []File{
			{Path: "/usr/bin/tool", Source: src},
			{Path: "/etc/motd", IsData: true, Data: []byte("hello\n")},
			{Path: "/bin/t", Link: "/usr/bin/tool"},
			{Path: "/tmp", Mode: 0o777 | os.ModeSticky},
		},
	}
	archive := filepath.Join(dir, "tool.tar")
	if err := WriteArchive(archive, spec); err != nil {
		t.Fatalf("WriteArchive: %v", err)
	}

	tag, err := name.NewTag(spec.Ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatalf("reading archive back: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Config.Entrypoint, spec.Entrypoint) || !slices.Equal(cfg.Config.Env, spec.Env) {
		t.Errorf("config = %+v, want entrypoint %v env %v", cfg.Config, spec.Entrypoint, spec.Env)
	}
	if cfg.OS != "linux" {
		t.Errorf("OS = %q, want linux", cfg.OS)
	}

	type entry struct {
		typ  byte
		mode int64
		link string
		data string
	}
	want := map[string]entry{
		"bin":          {typ: tar.TypeDir, mode: 0o755},
		"bin/t":        {typ: tar.TypeSymlink, mode: 0o777, link: "/usr/bin/tool"},
		"etc":          {typ: tar.TypeDir, mode: 0o755},
		"etc/motd":     {typ: tar.TypeReg, mode: 0o644, data: "hello\n"},
		"tmp":          {typ: tar.TypeDir, mode: 0o1777},
		"usr":          {typ: tar.TypeDir, mode: 0o755},
		"usr/bin":      {typ: tar.TypeDir, mode: 0o755},
		"usr/bin/tool": {typ: tar.TypeReg, mode: 0o755, data: "#!/bin/true\n"},
	}
	got := map[string]entry{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", hdr.Name, hdr.Uid, hdr.Gid)
		}
		got[strings.TrimSuffix(hdr.Name, "/")] = entry{typ: hdr.Typeflag, mode: hdr.Mode, link: hdr.Linkname, data: string(data)}
	}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("layer entry %s = %+v, want %+v", n, got[n], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("layer has %d entries, want %d: %v", len(got), len(want), got)
	}

	// Same inputs, same digest: rebuilding must not make the cluster
	// re-import an unchanged image under a new digest.
	again := filepath.Join(dir, "again.tar")
	if err := WriteArchive(again, spec); err != nil {
		t.Fatal(err)
	}
	img2, err := tarball.ImageFromPath(again, &tag)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := img2.Digest()
	if d1 != d2 {
		t.Errorf("rebuilt digest %s differs from %s", d2, d1)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".new-*")); len(leftovers) != 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}
}

func TestWriteArchiveRefusesFileUnderFile(t *testing.T) {
	spec := Spec{Ref: "localhost/x:y", Files: []File{
		{Path: "/a", IsData: true},
		{Path: "/a/b", IsData: true},
	}}
	err := WriteArchive(filepath.Join(t.TempDir(), "x.tar"), spec)
	if err == nil || !strings.Contains(err.Error(), "needs directory /a") {
		t.Fatalf("WriteArchive = %v, want error about /a", err)
	}
}

func TestBusyboxFiles(t *testing.T) {
	// A stand-in that answers --list-full like busybox does.
	fake := filepath.Join(t.TempDir(), "busybox")
	script := "#!/bin/sh\n[ \"$1\" = --list-full ] || exit 2\nprintf 'bin/busybox\\nbin/sh\\nusr/bin/awk\\nsbin/ip\\n'\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	files, err := BusyboxFiles(t.Context(), fake)
	if err != nil {
		t.Fatal(err)
	}
	want := []File{
		{Path: "/bin/busybox", Source: fake, Mode: 0o755},
		{Path: "/bin/sh", Link: "/bin/busybox"},
		{Path: "/usr/bin/awk", Link: "/bin/busybox"},
		{Path: "/sbin/ip", Link: "/bin/busybox"},
	}
	if len(files) != len(want) {
		t.Fatalf("BusyboxFiles = %+v, want %+v", files, want)
	}
	for i := range want {
		if files[i].Path != want[i].Path || files[i].Link != want[i].Link || files[i].Source != want[i].Source {
			t.Errorf("file %d = %+v, want %+v", i, files[i], want[i])
		}
	}

	if _, err := BusyboxFiles(t.Context(), filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "busybox-static") {
		t.Errorf("missing binary: err = %v, want a hint about busybox-static", err)
	}
}

func TestPushToARegistry(t *testing.T) {
	reg := registrytest.New(t)
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	if err := os.WriteFile(filepath.Join(os.Getenv("DOCKER_CONFIG"), "config.json"), reg.DockerConfig(registrytest.User, registrytest.Password), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "layercache")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(reg.CA)
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	s := Spec{Ref: reg.Host + "/layercache/layercache:v0.1.0", Files: []File{{Path: "/layercache", Source: bin}}, Entrypoint: []string{"/layercache"}}
	if err := Push(context.Background(), s, remote.WithTransport(transport)); err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref, remote.WithTransport(transport), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		t.Fatalf("pull the pushed image: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil || !slices.Equal(cfg.Config.Entrypoint, []string{"/layercache"}) {
		t.Errorf("pushed image config %+v (%v): want entrypoint /layercache", cfg, err)
	}
}
