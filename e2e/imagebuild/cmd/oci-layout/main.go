// Command oci-layout writes the image of a `docker save` archive as an OCI
// image layout directory, for e2e/cluster/buildkit.sh: the cluster has no
// registry its builds could pull a base image from, so BuildKit's image
// takes the e2e busybox image along as a layout, which buildctl hands to
// the build as a named context (--oci-layout, context:NAME=oci-layout://).
//
//	oci-layout --archive _output/images/busybox.tar --ref localhost/busybox:e2e --output DIR
//
// It prints the digest of the image's manifest, which an oci-layout://
// context must name. The layout holds OCI media types only (the archive's
// are Docker's), one manifest for the archive's platform, and the
// reference as the manifest's org.opencontainers.image.ref.name.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/spf13/cobra"
)

type options struct {
	archive string
	ref     string
	output  string
}

func (o *options) validate() error {
	if o.archive == "" || o.ref == "" || o.output == "" {
		return fmt.Errorf("--archive, --ref and --output are required, e.g. --archive _output/images/busybox.tar --ref localhost/busybox:e2e --output _output/buildkit/oci/busybox")
	}
	if _, err := name.NewTag(o.ref); err != nil {
		return fmt.Errorf("--ref %q: want a tagged reference such as localhost/busybox:e2e: %w", o.ref, err)
	}
	if _, err := os.Stat(o.output); err == nil {
		return fmt.Errorf("--output %s exists; remove it first (a layout's index would otherwise list the old image too)", o.output)
	}
	return nil
}

// convert reads the image ref from the archive and writes it to a new
// layout at output; it returns the manifest's digest.
func convert(o *options) (v1.Hash, error) {
	tag, err := name.NewTag(o.ref)
	if err != nil {
		return v1.Hash{}, err
	}
	src, err := tarball.ImageFromPath(o.archive, &tag)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading %s from %s: %w", o.ref, o.archive, err)
	}
	cfg, err := src.ConfigFile()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("config of %s in %s: %w", o.ref, o.archive, err)
	}
	layers, err := src.Layers()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("layers of %s in %s: %w", o.ref, o.archive, err)
	}
	// The same layers (compressed) and config, under OCI media types.
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for _, l := range layers {
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer}); err != nil {
			return v1.Hash{}, err
		}
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return v1.Hash{}, err
	}
	p, err := layout.Write(o.output, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("creating the layout %s: %w", o.output, err)
	}
	err = p.AppendImage(img,
		layout.WithPlatform(v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}),
		layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": o.ref}))
	if err != nil {
		return v1.Hash{}, fmt.Errorf("writing %s to the layout %s: %w", o.ref, o.output, err)
	}
	return img.Digest()
}

func run(_ context.Context, out io.Writer, o *options) error {
	digest, err := convert(o)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, digest)
	return err
}

func main() {
	o := &options{}
	c := &cobra.Command{
		Use:          "oci-layout",
		Short:        "Write an image of a docker save archive as an OCI image layout",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return run(c.Context(), c.OutOrStdout(), o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.archive, "archive", "", "docker save archive to read, e.g. _output/images/busybox.tar")
	f.StringVar(&o.ref, "ref", "", "the image's reference in the archive, e.g. localhost/busybox:e2e")
	f.StringVarP(&o.output, "output", "o", "", "layout directory to create")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := c.ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}
