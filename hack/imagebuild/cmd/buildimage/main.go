// Command buildimage writes a container image archive (`docker save`
// format) from static binaries and files, for the e2e cluster harness:
//
//	buildimage --ref localhost/layercache:dev --output layercache.tar \
//	    --file _output/images/layercache:/layercache --entrypoint /layercache
//	buildimage --ref localhost/busybox:e2e --output busybox.tar --busybox /path/to/busybox
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/layercache/layercache/hack/imagebuild"
)

type options struct {
	ref        string
	output     string
	files      []string
	busybox    string
	entrypoint []string
	cmd        []string
	env        []string
	dirs       []string
	push       bool
}

func (o *options) validate() error {
	if o.ref == "" {
		return fmt.Errorf("--ref is required, e.g. --ref localhost/busybox:e2e")
	}
	if o.output == "" && !o.push {
		return fmt.Errorf("--output or --push is required: the archive file to write, or push to the reference's registry")
	}
	if len(o.files) == 0 && o.busybox == "" {
		return fmt.Errorf("nothing to put in %s: give --file SRC:DST or --busybox PATH", o.ref)
	}
	for _, f := range o.files {
		if src, dst, ok := strings.Cut(f, ":"); !ok || src == "" || dst == "" {
			return fmt.Errorf("--file %q: want HOST_PATH:IMAGE_PATH, e.g. bin/layercache:/layercache", f)
		}
	}
	for _, e := range o.env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("--env %q: want NAME=VALUE", e)
		}
	}
	return nil
}

func (o *options) spec(ctx context.Context) (imagebuild.Spec, error) {
	s := imagebuild.Spec{Ref: o.ref, Entrypoint: o.entrypoint, Cmd: o.cmd, Env: o.env}
	if o.busybox != "" {
		files, err := imagebuild.BusyboxFiles(ctx, o.busybox)
		if err != nil {
			return s, err
		}
		s.Files = append(s.Files, files...)
	}
	for _, f := range o.files {
		src, dst, _ := strings.Cut(f, ":")
		s.Files = append(s.Files, imagebuild.File{Path: dst, Source: src})
	}
	for _, d := range o.dirs {
		s.Files = append(s.Files, imagebuild.File{Path: d, Mode: 0o777 | os.ModeSticky})
	}
	return s, nil
}

func newCommand() *cobra.Command {
	o := &options{}
	c := &cobra.Command{
		Use:          "buildimage",
		Short:        "Write a container image archive from static binaries and files",
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
	f.StringVar(&o.ref, "ref", "", "image reference, e.g. localhost/layercache:dev")
	f.StringVarP(&o.output, "output", "o", "", "archive file to write")
	f.StringArrayVar(&o.files, "file", nil, "HOST_PATH:IMAGE_PATH of a file to copy (repeatable)")
	f.StringVar(&o.busybox, "busybox", "", "static busybox binary: added as /bin/busybox with a link per applet")
	f.StringArrayVar(&o.entrypoint, "entrypoint", nil, "entrypoint argument (repeat for each word)")
	f.StringArrayVar(&o.cmd, "cmd", nil, "default command argument (repeat for each word)")
	f.StringArrayVar(&o.env, "env", nil, "NAME=VALUE in the image's environment (repeatable)")
	f.StringArrayVar(&o.dirs, "tmpdir", nil, "world-writable sticky directory to create, e.g. /tmp (repeatable)")
	f.BoolVar(&o.push, "push", false, "push the image to the registry of --ref, with the credentials of docker login ($DOCKER_CONFIG)")
	return c
}

func run(ctx context.Context, out io.Writer, o *options) error {
	s, err := o.spec(ctx)
	if err != nil {
		return err
	}
	if o.output != "" {
		if err := imagebuild.WriteArchive(o.output, s); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "%s\t%s\n", o.ref, o.output); err != nil {
			return err
		}
	}
	if !o.push {
		return nil
	}
	if err := imagebuild.Push(ctx, s); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\tpushed\n", o.ref)
	return err
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}
