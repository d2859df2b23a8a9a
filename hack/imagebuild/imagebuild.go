// Package imagebuild writes container image archives from static binaries
// and files, without a Docker engine, a registry or a base image.
//
// An archive is a `docker save` tarball with one layer: the format both
// `ctr images import` (local e2e cluster) and `kind load image-archive`
// read. Timestamps are fixed, so the same inputs give the same image digest.
package imagebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is the time stamped on every file and on the image, so that
// rebuilding unchanged inputs yields an identical image.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of the image's filesystem. Exactly one of Source, Data
// (with IsData) or Link describes its content; a File with none of them is a
// directory.
type File struct {
	// Path is the absolute path inside the image, e.g. /bin/busybox.
	Path string
	// Mode holds the permission bits; 0 means 0755 for directories and
	// executables from Source, 0644 for Data.
	Mode fs.FileMode
	// Source is a regular file on the host whose content is copied.
	Source string
	// Data is the content of a regular file when IsData is set.
	Data   []byte
	IsData bool
	// Link is the target of a symbolic link.
	Link string
}

func (f File) isDir() bool { return f.Source == "" && !f.IsData && f.Link == "" }

// Spec describes one image.
type Spec struct {
	// Ref names the image, e.g. localhost/layercache:dev.
	Ref        string
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	Files      []File
}

// Validate reports the first problem that would make the image unusable.
func (s Spec) Validate() error {
	if _, err := name.NewTag(s.Ref, name.StrictValidation); err != nil {
		return fmt.Errorf("image reference %q: %w (use REGISTRY/REPOSITORY:TAG, e.g. localhost/busybox:e2e)", s.Ref, err)
	}
	if len(s.Files) == 0 {
		return fmt.Errorf("image %s has no files: add at least the entrypoint binary", s.Ref)
	}
	seen := map[string]bool{}
	for _, f := range s.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("image %s: file path %q must be absolute and clean, e.g. /bin/sh", s.Ref, f.Path)
		}
		kinds := 0
		for _, set := range []bool{f.Source != "", f.IsData, f.Link != ""} {
			if set {
				kinds++
			}
		}
		if kinds > 1 {
			return fmt.Errorf("image %s: file %s sets more than one of Source, Data and Link", s.Ref, f.Path)
		}
		if seen[f.Path] {
			return fmt.Errorf("image %s: file %s is listed twice", s.Ref, f.Path)
		}
		seen[f.Path] = true
	}
	if len(s.Entrypoint) > 0 && path.IsAbs(s.Entrypoint[0]) && !seen[s.Entrypoint[0]] {
		return fmt.Errorf("image %s: entrypoint %s is not among the image's files", s.Ref, s.Entrypoint[0])
	}
	return nil
}

// Build assembles the image in memory.
func Build(s Spec) (v1.Image, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	layerTar, err := layerTarball(s.Files)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, fmt.Errorf("image %s: layer: %w", s.Ref, err)
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		Config: v1.Config{
			Entrypoint: s.Entrypoint,
			Cmd:        s.Cmd,
			Env:        s.Env,
			WorkingDir: s.WorkingDir,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", s.Ref, err)
	}
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	return img, nil
}

// WriteArchive builds the image and writes it to file as a `docker save`
// tarball. The file is replaced atomically, so an interrupted build never
// leaves a truncated archive for the cluster to import.
func WriteArchive(file string, s Spec) (err error) {
	img, err := Build(s)
	if err != nil {
		return err
	}
	tag, err := name.NewTag(s.Ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", s.Ref, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".new-"+filepath.Base(file)+"-*")
	if err != nil {
		return fmt.Errorf("image %s: %w", s.Ref, err)
	}
	tmpName := tmp.Name()
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmpName)
		}
	}()
	w := bufio.NewWriterSize(tmp, 1<<20)
	if err = tarball.Write(tag, img, w); err != nil {
		return fmt.Errorf("image %s: writing %s: %w", s.Ref, file, err)
	}
	if err = w.Flush(); err != nil {
		return fmt.Errorf("image %s: writing %s: %w", s.Ref, file, err)
	}
	if err = tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("image %s: %w", s.Ref, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("image %s: writing %s: %w", s.Ref, file, err)
	}
	if err = os.Rename(tmpName, file); err != nil {
		return fmt.Errorf("image %s: %w", s.Ref, err)
	}
	return nil
}

// layerTarball returns the uncompressed layer: the files in path order, with
// every parent directory they need, owned by root.
func layerTarball(files []File) ([]byte, error) {
	entries := map[string]File{}
	for _, f := range files {
		entries[f.Path] = f
		for dir := path.Dir(f.Path); dir != "/"; dir = path.Dir(dir) {
			if existing, ok := entries[dir]; ok && !existing.isDir() {
				return nil, fmt.Errorf("%s needs directory %s, but the image has a file there", f.Path, dir)
			}
			if _, ok := entries[dir]; !ok {
				entries[dir] = File{Path: dir}
			}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		if err := writeEntry(tw, entries[p]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeEntry(tw *tar.Writer, f File) error {
	hdr := &tar.Header{
		Name:    strings.TrimPrefix(f.Path, "/"),
		ModTime: epoch,
		Format:  tar.FormatPAX,
	}
	var content []byte
	switch {
	case f.Link != "":
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = f.Link
		hdr.Mode = 0o777
	case f.IsData:
		hdr.Typeflag = tar.TypeReg
		hdr.Mode = modeOr(f.Mode, 0o644)
		content = f.Data
	case f.Source != "":
		data, err := os.ReadFile(f.Source)
		if err != nil {
			return fmt.Errorf("reading %s for %s: %w", f.Source, f.Path, err)
		}
		info, err := os.Stat(f.Source)
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return fmt.Errorf("source %s for %s is not a regular file", f.Source, f.Path)
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Mode = modeOr(f.Mode, info.Mode().Perm())
		content = data
	default:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		hdr.Mode = modeOr(f.Mode, 0o755)
	}
	hdr.Size = int64(len(content))
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("layer entry %s: %w", f.Path, err)
	}
	if _, err := tw.Write(content); err != nil {
		return fmt.Errorf("layer entry %s: %w", f.Path, err)
	}
	return nil
}

// modeOr returns m's permission and sticky bits, or def's when m has none.
func modeOr(m, def fs.FileMode) int64 {
	if m.Perm() == 0 {
		m = def
	}
	mode := int64(m.Perm())
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// BusyboxFiles returns the busybox binary at /bin/busybox and a symbolic
// link to it for every applet it was built with, as `busybox --list-full`
// names them (bin/sh, usr/bin/awk, ...). The binary must be static: the
// image has no C library.
func BusyboxFiles(ctx context.Context, busybox string) ([]File, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(exitErr.Stderr))
		}
		return nil, fmt.Errorf("listing applets of %s (need a busybox binary, e.g. from Debian's busybox-static): %w", busybox, err)
	}
	files := []File{{Path: "/bin/busybox", Source: busybox, Mode: 0o755}}
	for _, applet := range strings.Fields(string(out)) {
		p := "/" + strings.TrimPrefix(path.Clean(applet), "/")
		if p == "/bin/busybox" {
			continue
		}
		files = append(files, File{Path: p, Link: "/bin/busybox"})
	}
	if len(files) == 1 {
		return nil, fmt.Errorf("%s --list-full printed no applets", busybox)
	}
	return files, nil
}

// Push builds the image and pushes it to its reference's registry with
// the credentials of the local docker config (docker login, or
// $DOCKER_CONFIG), as crane and docker push do.
func Push(ctx context.Context, s Spec, opts ...remote.Option) error {
	img, err := Build(s)
	if err != nil {
		return err
	}
	ref, err := name.ParseReference(s.Ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", s.Ref, err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	if err := remote.Write(ref, img, opts...); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}
