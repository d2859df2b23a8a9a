package layerfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layercache/layercache/layerfs/ondisk"
)

// asUser runs a shell command as uid/gid 1000 with no supplementary groups
// and reports its error and output.
func asUser(t *testing.T, script string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "sh", "-c", script).CombinedOutput()
	return string(out), err
}

// publicDir makes a directory that any user can traverse, with all its
// parents up to /tmp, as a node's /var/lib would be.
func publicDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}
	return dir
}

// Issue 8, item 3: a volume root's mode (0777 by default) became its
// layer's root mode, and layer paths are public in /proc/*/mountinfo, so
// any host user could plant files in any cache. The store's directories
// are root-only now; a pod still writes its volume through the kubelet's
// bind mount of the merged directory.
func TestLayersWorldWritable(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{Root: filepath.Join(publicDir(t), "store")})
	writeFile(t, filepath.Join(mustMount(t, s, "w", "ns/c"), "f"), "x")
	layer := s.layerDir(mustCommit(t, s, "w").Layer)
	var st unix.Stat_t
	must(t, unix.Stat(layer, &st))
	if st.Mode&0o777 != 0o777 {
		t.Fatalf("layer root mode %o; the test wants a world-writable layer root to prove the parents protect it", st.Mode&0o777)
	}
	merged := mustMount(t, s, "pod", "ns/c")
	for _, path := range []string{layer, upperOf(t, s, "pod"), s.emptyLayer()} {
		if out, err := asUser(t, "touch "+path+"/planted"); err == nil {
			t.Errorf("uid 1000 planted a file in %s (%s)", path, out)
		}
	}
	for _, dir := range []string{s.layersDir(), s.cachesDir(), s.volumesDir(), s.locksDir(), s.tmpDir()} {
		if out, err := asUser(t, "ls "+dir); err == nil {
			t.Errorf("uid 1000 can list %s: %s", dir, out)
		}
	}

	// The kubelet bind-mounts the merged directory into the pod.
	podDir := filepath.Join(publicDir(t), "volume")
	must(t, os.Mkdir(podDir, 0o755))
	must(t, unix.Mount(merged, podDir, "", unix.MS_BIND, ""))
	t.Cleanup(func() { ondisk.Unmount(podDir) })
	if out, err := asUser(t, "echo from-pod > "+podDir+"/built && cat "+podDir+"/f"); err != nil || out != "x" {
		t.Fatalf("uid 1000 cannot use the volume through a bind mount: %v: %s", err, out)
	}
	must(t, unix.Unmount(podDir, 0))
	if got := readFile(t, filepath.Join(merged, "built")); got != "from-pod\n" {
		t.Fatalf("the pod's write is not in the volume: %q", got)
	}
	// Reopening tightens an existing store, too.
	must(t, os.Chmod(s.layersDir(), 0o711))
	if _, err := Open(ctx, Options{Root: s.Root()}); err != nil {
		t.Fatal(err)
	}
	must(t, unix.Stat(s.layersDir(), &st))
	if st.Mode&0o777 != 0o700 {
		t.Errorf("layers/ mode %o after Open, want 700", st.Mode&0o777)
	}
}

// Issue 8, item 3: volumes were mounted without nosuid and nodev, so a
// build could leave a set-id root shell or a device node in a cache.
func TestVolumeMountFlags(t *testing.T) {
	tests := []struct {
		name      string
		opts      MountOptions
		wantFlags int64
		wantNot   int64
	}{
		{"default", MountOptions{}, unix.ST_NOSUID | unix.ST_NODEV, 0},
		{"allowed", MountOptions{AllowSetuid: true, AllowDevices: true}, 0, unix.ST_NOSUID | unix.ST_NODEV},
	}
	s := newTestStore(t, Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			tt.opts.Cache = mustRef(t, "ns/c")
			id := "v-" + strings.ToLower(tt.name)
			v, err := s.Mount(ctx, id, tt.opts)
			must(t, err)
			check := func(when string) {
				var st unix.Statfs_t
				must(t, unix.Statfs(v.MergedPath, &st))
				if st.Flags&tt.wantFlags != tt.wantFlags || st.Flags&tt.wantNot != 0 {
					t.Errorf("%s: mount flags %#x, want %#x set and %#x clear", when, st.Flags, tt.wantFlags, tt.wantNot)
				}
			}
			check("mount")
			must(t, unix.Unmount(v.MergedPath, 0)) // a reboot
			if _, err := s.Recover(ctx); err != nil {
				t.Fatal(err)
			}
			check("remount")
		})
	}
}

// The hand-split mountinfo parser compared the escaped mount point
// ("store\040root") with the real path, so Recover left the mounts of a
// crashed squash mounted under a root with a space and then failed to
// remove them.
func TestUnmountAllSpaceInRoot(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, Options{Root: filepath.Join(t.TempDir(), "store root")})
	mustMount(t, s, "v", "ns/c")
	view := filepath.Join(s.tmpDir(), "squash-1", "view") // as a crashed squash leaves it
	must(t, os.MkdirAll(view, 0o700))
	must(t, unix.Mount("tmpfs", view, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { unix.Unmount(view, unix.MNT_DETACH) })
	if _, err := s.Recover(ctx); err != nil {
		t.Fatalf("Recover under a root with a space: %v", err)
	}
	if ondisk.IsMountPoint(view) || ondisk.Exists(view) {
		t.Error("the crashed squash's view is still there")
	}
	if err := unmountAll(s.Root()); err != nil {
		t.Fatal(err)
	}
	if ondisk.IsMountPoint(s.mergedDir("v")) {
		t.Error("unmountAll left the volume mounted")
	}
}
