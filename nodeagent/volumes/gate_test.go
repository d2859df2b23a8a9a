package volumes

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/layerfs/lazyfs"
)

// TestMountGateReboot mounts the gate's tmpfs for real (root): a gated
// PV's path leads to its volume's mount point; a reboot (the tmpfs
// unmounted) makes the path vanish, which the kubelet's hostPath check
// refuses; the agent's startup (mountGate, remount) brings it back.
func TestMountGateReboot(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	dir := filepath.Join(root, GateDir)
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	env := newTestEnv(t, nil)
	if _, err := env.store.Mount(ctx, "pvc-bound", layerfs.MountOptions{Cache: maven, Writer: "ci/p"}); err != nil {
		t.Fatal(err)
	}
	mountPoint := filepath.Join(root, "volumes", "pvc-bound", "merged")
	if err := os.MkdirAll(mountPoint, 0o755); err != nil {
		t.Fatal(err)
	}
	env.store.VolumeByID["pvc-bound"].MergedPath = mountPoint
	pv := testPV(map[string]string{v1alpha1.AnnotationNode: "node-a"})
	pv.Name, pv.Status.Phase = "pvc-bound", corev1.VolumeBound
	pv.Spec.HostPath = &corev1.HostPathVolumeSource{Path: gatePath(root, pv.Name)}

	steps := []struct {
		name     string
		do       func() error
		wantPath bool
	}{
		{"mount the gate", func() error { return mountGate(root) }, false},
		{"mount it again (an agent restart)", func() error { return mountGate(root) }, false},
		{"provision", func() error { return openGate(root, pv.Name, mountPoint) }, true},
		{"open it again", func() error { return openGate(root, pv.Name, mountPoint) }, true},
		{"reboot", func() error { return unix.Unmount(dir, 0) }, false},
		{"agent startup", func() error {
			if err := mountGate(root); err != nil {
				return err
			}
			remount(ctx, env.store, env.events, env.prov.metrics, "node-a", root, []*corev1.PersistentVolume{pv})
			return nil
		}, true},
		{"volume ended", func() error { return closeGate(root, pv.Name) }, false},
		{"ended again", func() error { return closeGate(root, pv.Name) }, false},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if mounted, err := mountinfo.Mounted(dir); err != nil || mounted != (s.name != "reboot") {
			t.Errorf("%s: gate mounted %v (%v)", s.name, mounted, err)
		}
		// The kubelet's hostPath check of type Directory.
		fi, err := os.Stat(pv.Spec.HostPath.Path)
		if got := err == nil && fi.IsDir(); got != s.wantPath {
			t.Errorf("%s: the PV's path is a directory: %v (%v), want %v", s.name, got, err, s.wantPath)
		}
	}
}

// The lazyfs sidecar may listen before its agent mounts the gate (both
// containers of the pod start together): the gate's tmpfs must not hide
// its socket. Needs root.
func TestMountGateLeavesTheSidecarReachable(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	cfg := layerfs.LazyfsSidecar(root)
	sc, err := lazyfs.ServeSidecar(cfg, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	dir := filepath.Join(root, GateDir)
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := mountGate(root); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", cfg.Control)
	if err != nil {
		t.Fatalf("the sidecar's socket after the gate's mount: %v", err)
	}
	conn.Close()
}
