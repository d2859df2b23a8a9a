package main

import (
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/layercache/layercache/hack/imagebuild"
)

// TestConvert: an archive as hack/imagebuild writes the e2e images becomes
// a layout of one OCI manifest, for the archive's platform, named by the
// reference, with the same config and layer contents; the printed digest
// is the manifest's, as an oci-layout:// context must name it.
func TestConvert(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "busybox.tar")
	spec := imagebuild.Spec{
		Ref:   "localhost/busybox:e2e",
		Cmd:   []string{"/bin/sh"},
		Env:   []string{"PATH=/bin"},
		Files: []imagebuild.File{{Path: "/bin/sh", Data: []byte("#!\n"), IsData: true, Mode: 0o755}},
	}
	if err := imagebuild.WriteArchive(archive, spec); err != nil {
		t.Fatal(err)
	}
	o := &options{archive: archive, ref: spec.Ref, output: filepath.Join(dir, "oci", "busybox")}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	digest, err := convert(o)
	if err != nil {
		t.Fatal(err)
	}

	index, err := layout.ImageIndexFromPath(o.output)
	if err != nil {
		t.Fatalf("reading the layout back: %v", err)
	}
	m, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("the layout lists %d manifests, want 1", len(m.Manifests))
	}
	desc := m.Manifests[0]
	if desc.Digest != digest || desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("the layout's manifest is %s (%s), want %s (%s)", desc.Digest, desc.MediaType, digest, types.OCIManifestSchema1)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != spec.Ref {
		t.Errorf("ref.name annotation = %q, want %q", got, spec.Ref)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture == "" {
		t.Errorf("platform = %+v, want linux and an architecture", desc.Platform)
	}
	img, err := index.Image(digest)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if manifest.Config.MediaType != types.OCIConfigJSON || len(manifest.Layers) != 1 || manifest.Layers[0].MediaType != types.OCILayer {
		t.Errorf("manifest %+v, want an OCI config and one OCI layer", manifest)
	}
	tag, err := name.NewTag(spec.Ref)
	if err != nil {
		t.Fatal(err)
	}
	src, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	srcLayers, err := src.Layers()
	if err != nil {
		t.Fatal(err)
	}
	srcDigest, err := srcLayers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) == 1 && manifest.Layers[0].Digest != srcDigest {
		t.Errorf("layer %s, want the archive's %s", manifest.Layers[0].Digest, srcDigest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Config.Cmd) != 1 || cfg.Config.Cmd[0] != "/bin/sh" {
		t.Errorf("config Cmd = %q, want the archive's [/bin/sh]", cfg.Config.Cmd)
	}
	if err := o.validate(); err == nil {
		t.Error("validate accepted an existing --output")
	}
}
