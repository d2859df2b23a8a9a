package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// MaxDepth is the kernel's limit on lower layers (OVL_MAX_STACK).
const MaxDepth = 500

// overlayFeatures keep every upper directory self-contained, so it can
// become a lower layer of other mounts: no redirects or metacopy files that
// point into the layers below, no index tied to this mount.
var overlayFeatures = []string{"index=off", "redirect_dir=off", "metacopy=off"}

// volatileFeature drops every sync to the upper filesystem while a volume
// is mounted. A build cache needs durability only once it is committed, and
// Commit fsyncs exactly the upper layer's files then. Without it, each
// unmount syncs the whole filesystem under the store, which on a busy node
// means waiting for every other pod's writes.
const volatileFeature = "volatile"

// Spec is an overlay mount described as data, so that it can be tested
// without root and printed for debugging.
type Spec struct {
	Lower []string // newest (top) first
	Upper string   // empty for a read-only mount of the lower layers
	Work  string
	// AllowSetuid and AllowDevices lift nosuid and nodev, which every
	// mount gets by default: a volume is filled by untrusted builds and
	// must not become a way to run set-id programs or reach host devices.
	AllowSetuid, AllowDevices bool
}

// flags are the mount flags (mount(2)), the matching new-API attributes
// (fsmount(2)) and their names for mount(8).
func (m Spec) flags() (flags uintptr, attr int, names []string) {
	if m.Upper == "" {
		flags, attr, names = flags|unix.MS_RDONLY, attr|unix.MOUNT_ATTR_RDONLY, append(names, "ro")
	}
	if !m.AllowSetuid {
		flags, attr, names = flags|unix.MS_NOSUID, attr|unix.MOUNT_ATTR_NOSUID, append(names, "nosuid")
	}
	if !m.AllowDevices {
		flags, attr, names = flags|unix.MS_NODEV, attr|unix.MOUNT_ATTR_NODEV, append(names, "nodev")
	}
	return flags, attr, names
}

func (m Spec) options() []string {
	opts := []string{"lowerdir=" + strings.Join(m.Lower, ":")}
	if m.Upper != "" {
		opts = append(opts, "upperdir="+m.Upper, "workdir="+m.Work)
	}
	// Features come last: the kernel takes the last value of an option, and
	// nothing may turn them back on.
	return append(opts, m.features()...)
}

func (m Spec) features() []string {
	if m.Upper == "" {
		return overlayFeatures
	}
	return append(slices.Clone(overlayFeatures), volatileFeature)
}

// data is the option string for mount(2).
func (m Spec) data() string { return strings.Join(m.options(), ",") }

// Command is the equivalent mount(8) command line.
func (m Spec) Command(target string) string {
	_, _, names := m.flags()
	return fmt.Sprintf("mount -t overlay overlay -o %s %s", strings.Join(append(names, m.data()), ","), target)
}

func (m Spec) validate() error {
	if len(m.Lower) == 0 {
		return errors.New("overlay needs at least one lower layer")
	}
	if len(m.Lower) > MaxDepth {
		return fmt.Errorf("%d layers exceed overlayfs's limit of %d; squash the cache (layerfs squash)", len(m.Lower), MaxDepth)
	}
	return nil
}

// Mount mounts the overlay at target. mount(2) takes at most one page of
// options; longer chains go through the new mount API, which takes one
// lower layer at a time ("lowerdir+", Linux 6.8+).
func (m Spec) Mount(target string) error {
	if err := m.validate(); err != nil {
		return err
	}
	flags, _, _ := m.flags()
	if data := m.data(); len(data) < os.Getpagesize() {
		if err := unix.Mount("overlay", target, "overlay", flags, data); err != nil {
			return fmt.Errorf("%s: %w", m.Command(target), err)
		}
		return nil
	}
	if err := m.fsmount(target); err != nil {
		return fmt.Errorf("mount overlay of %d layers at %s with the new mount API (needs Linux 6.8 or later; squash the cache to shorten the chain): %w", len(m.Lower), target, err)
	}
	return nil
}

func (m Spec) fsmount(target string) error {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fsfd)
	set := func(key, value string) error {
		if err := unix.FsconfigSetString(fsfd, key, value); err != nil {
			return fmt.Errorf("fsconfig %s=%s: %w", key, value, err)
		}
		return nil
	}
	if err := set("source", "overlay"); err != nil {
		return err
	}
	for _, l := range m.Lower {
		if err := set("lowerdir+", l); err != nil {
			return err
		}
	}
	if m.Upper != "" {
		if err := set("upperdir", m.Upper); err != nil {
			return err
		}
		if err := set("workdir", m.Work); err != nil {
			return err
		}
	}
	for _, f := range m.features() {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			if err := unix.FsconfigSetFlag(fsfd, k); err != nil {
				return fmt.Errorf("fsconfig %s: %w", k, err)
			}
			continue
		}
		if err := set(k, v); err != nil {
			return err
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("fsconfig create: %w", err)
	}
	_, attr, _ := m.flags()
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attr)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount to %s: %w", target, err)
	}
	return nil
}

// Probe proves the directory's filesystem can host overlay upper and
// work directories, including whiteouts, with a real mount.
func Probe(ctx context.Context, dir string) (err error) {
	probe, err := os.MkdirTemp(dir, "probe-")
	if err != nil {
		return fmt.Errorf("create probe directory: %w", err)
	}
	defer os.RemoveAll(probe)
	spec := Spec{Lower: []string{filepath.Join(probe, "l")}, Upper: filepath.Join(probe, "u"), Work: filepath.Join(probe, "w")}
	merged := filepath.Join(probe, "m")
	for _, d := range []string{spec.Lower[0], spec.Upper, spec.Work, merged} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("create probe directory: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(spec.Lower[0], "f"), nil, 0o600); err != nil {
		return fmt.Errorf("write probe file: %w", err)
	}
	if err := spec.Mount(merged); err != nil {
		return fmt.Errorf("%w (filesystem %s; use ext4, xfs with ftype=1, btrfs or tmpfs, and run as root)", err, ondisk.FSTypeName(dir))
	}
	defer func() {
		if uerr := ondisk.Unmount(merged); uerr != nil && err == nil {
			err = uerr
		}
	}()
	if err := os.Remove(filepath.Join(merged, "f")); err != nil {
		return fmt.Errorf("delete through the probe overlay: %w", err)
	}
	if !IsWhiteout(filepath.Join(spec.Upper, "f")) {
		return fmt.Errorf("deleting a lower file left no whiteout in the upper directory (filesystem %s)", ondisk.FSTypeName(dir))
	}
	return ctx.Err()
}

// IsWhiteout tells whether path is an overlay whiteout (a 0/0 char device).
func IsWhiteout(path string) bool {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}
