package volumes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// The labels a CSI volume keeps in the store (layerfs.MountOptions.Labels):
// all that its end needs, so that it ends correctly after an agent
// restart, when the kubelet's unpublish carries only the volume id and the
// target path.
const (
	labelCSIVolume    = "layercache.dev/csi-volume" // the kubelet's volume id
	labelCSITarget    = "layercache.dev/csi-target"
	labelPodNamespace = "layercache.dev/pod-namespace"
	labelPodName      = "layercache.dev/pod-name"
	labelPodUID       = "layercache.dev/pod-uid"
	labelCommit       = v1alpha1.AnnotationCommit
	// labelStorageClass is the class the volume's storageClass attribute
	// named, if any. Its end needs no more of it than a claim's end needs
	// of its class: the registry it publishes to is the one Pull recorded
	// on the Cache (status.published), which a restarted agent reads
	// again. It says where the volume's settings came from (inspect).
	labelStorageClass = v1alpha1.LabelStorageClass
)

// csiVolumePrefix starts the store names of CSI volumes (claims' are
// their PVs' names, pvc-...).
const csiVolumePrefix = "csi-"

// csiDriver serves the CSI Identity and Node services of inline volumes:
// NodePublishVolume mounts a layerfs volume at the pod's target path,
// NodeUnpublishVolume ends it (commit or discard) once the pod's outcome
// is known, or leaves that to the pod watch (csiend.go).
type csiDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer

	prov *Provisioner
	// kubeletDir is the kubelet's root directory: target paths must be
	// below its pods directory.
	kubeletDir string
	// limits bound every volume's size attribute (Options.CSIDefaultBytes
	// and CSIMaxBytes).
	limits kit.CSILimits
	// locks are shared with ends, which ends CSI volumes whose pods
	// ended.
	locks *volumeLocks
	ends  *csiEnds
}

func newCSIDriver(prov *Provisioner, ends *csiEnds, locks *volumeLocks, kubeletDir string, limits kit.CSILimits) *csiDriver {
	return &csiDriver{prov: prov, ends: ends, locks: locks, kubeletDir: kubeletDir, limits: limits}
}

// GetPluginInfo names the driver.
func (d *csiDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: v1alpha1.CSIDriverName, VendorVersion: "v1alpha1"}, nil
}

// GetPluginCapabilities: a node plugin only, with no controller service.
func (d *csiDriver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

// Probe answers once the agent serves: the kubelet registers the driver
// only then.
func (d *csiDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// NodeGetCapabilities: no staging; volumes are published straight to
// their pods.
func (d *csiDriver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// NodeGetInfo names the node; volumes have no topology beyond it.
func (d *csiDriver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.prov.node}, nil
}

// NodePublishVolume mounts a copy-on-write view of the volume's cache at
// its target path. The kubelet retries it until it succeeds, and calls it
// again after its own restart: a volume already in the store is only
// mounted again where it is missing.
func (d *csiDriver) NodePublishVolume(ctx context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := d.checkTarget(r.GetVolumeId(), r.GetTargetPath()); err != nil {
		return nil, err
	}
	if r.GetVolumeCapability().GetBlock() != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s volumes are filesystems, not block devices: use volumeMounts, not volumeDevices", r.GetVolumeId(), v1alpha1.CSIDriverName)
	}
	pod, err := kit.ParseCSIPod(r.GetVolumeContext())
	if err == nil {
		err = d.checkPod(pod, r.GetTargetPath())
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %v", r.GetVolumeId(), err)
	}
	id := csiStoreID(r.GetVolumeId())
	unlock := d.locks.lock(id)
	defer unlock()
	logger := log.FromContext(ctx).WithValues("pod", pod.Key(), "volume", id)
	ctx = log.IntoContext(ctx, logger)

	vol, err := d.prov.store.Volume(ctx, id)
	if errors.Is(err, layerfs.ErrNotFound) && d.ends.ended(pod) {
		// A kubelet that restarted while the build ended publishes the
		// pod's volumes again; a new, empty volume would be ended once
		// more, a second commit of the same build.
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s: pod %s has ended and its build's volume was ended already; no new volume is made for it", id, pod.Key())
	}
	if err := d.prov.holds.hold(ctx, pod.Namespace, pod.Name, pod.UID); err != nil {
		return nil, status.Errorf(codes.Unavailable, "volume %s: hold pod %s until its build's end: %v", id, pod.Key(), err)
	}
	switch {
	case errors.Is(err, layerfs.ErrNotFound):
		if vol, err = d.mountNew(ctx, r, pod, id); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, status.Errorf(codes.Internal, "read volume %s: %v", id, err)
	case !vol.Mounted:
		// Remounted after a reboot: the store's Recover mounts it again.
		if vol, err = d.prov.store.Mount(ctx, id, layerfs.MountOptions{Cache: vol.Cache}); err != nil {
			return nil, status.Errorf(codes.Internal, "remount volume %s of cache %s: %v", id, vol.Cache, err)
		}
	}
	if err := bindTarget(vol.MergedPath, r.GetTargetPath(), r.GetReadonly()); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s of cache %s: %v", id, vol.Cache, err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// mountNew validates the request, as for a claim, and mounts its volume.
// A refusal is an Event on the pod and fails the mount with the same
// message, which the kubelet also shows on the pod.
func (d *csiDriver) mountNew(ctx context.Context, r *csi.NodePublishVolumeRequest, pod kit.CSIPod, id string) (*layerfs.Volume, error) {
	start := time.Now()
	p := d.prov
	req, err := p.csiRequest(ctx, r, pod, d.limits)
	if err != nil {
		var refused *kit.ClaimError
		if !errors.As(err, &refused) {
			p.metrics.Fail(kit.OpProvision, "api")
			return nil, status.Errorf(codes.Unavailable, "volume %s: %v", r.GetVolumeId(), err)
		}
		p.events.Eventf(pod.Object(), nil, corev1.EventTypeWarning, refused.Reason, kit.ActionProvision, "%s", refused.Message)
		p.metrics.Fail(kit.OpProvision, refused.Reason)
		code := codes.InvalidArgument
		switch refused.Reason {
		case kit.ReasonCacheAccessDenied, kit.ReasonCacheDeleting, kit.ReasonRegistryCache, kit.ReasonCSINotEnabled:
			code = codes.FailedPrecondition
		}
		return nil, status.Errorf(code, "%s", refused.Message)
	}
	p.admittedEvents(pod, req)
	if req.Registry != nil {
		// As for a claim: the node takes in the cache's published chain
		// (and the layers other nodes announced) before the kubelet gets
		// the volume, or seeds it from a fallback.
		p.sync.Pull(ctx, pod.Object(), req)
		req.Fallbacks, req.FallbackRepositories = p.sync.Seed(ctx, pod.Object(), req)
	}
	vol, err := p.store.Mount(ctx, id, csiMountOptions(r, pod, req))
	if errors.Is(err, layerfs.ErrLayoutMismatch) {
		msg := layoutMismatchMessage(req, err)
		p.events.Eventf(pod.Object(), nil, corev1.EventTypeWarning, kit.ReasonMountFailed, kit.ActionProvision, "%s", msg)
		p.metrics.Fail(kit.OpProvision, kit.ReasonMountFailed)
		return nil, status.Error(codes.FailedPrecondition, msg)
	}
	if err != nil {
		p.metrics.Fail(kit.OpProvision, kit.ReasonMountFailed)
		return nil, status.Errorf(codes.Internal, "mount volume %s of cache %s on node %s: %v", id, req.Cache, p.node, err)
	}
	p.metrics.ProvisionSeconds.WithLabelValues(string(req.Mode)).Observe(time.Since(start).Seconds())
	p.metrics.Provisioned(req.Cache, vol)
	// No status report now: the one at the build's end carries the new
	// generation, and the periodic pass shows a longer build's open
	// volume. That keeps a CSI build to two API writes: the end's Event
	// and its report.
	if vol.SeededFrom != nil {
		p.events.Eventf(pod.Object(), nil, corev1.EventTypeNormal, kit.ReasonSeeded, kit.ActionProvision,
			"volume %s of cache %s starts from fallback %s at generation %d: cache %s has no generation on node %s yet",
			id, req.Cache, vol.SeededFrom.Cache, vol.SeededFrom.Generation, req.Cache, p.node)
	}
	log.FromContext(ctx).Info("Published CSI volume", "cache", req.Cache.String(), "mode", req.Mode, "commit", req.Commit,
		"baseGeneration", vol.BaseGeneration, "seededFrom", seededFrom(vol), "target", r.GetTargetPath())
	return vol, nil
}

// csiMountOptions are the request's, with the labels its end reads back.
func csiMountOptions(r *csi.NodePublishVolumeRequest, pod kit.CSIPod, req kit.VolumeRequest) layerfs.MountOptions {
	opts := req.MountOptions()
	opts.Writer = pod.Key()
	opts.Labels = map[string]string{
		labelCSIVolume: r.GetVolumeId(), labelCSITarget: r.GetTargetPath(),
		labelPodNamespace: pod.Namespace, labelPodName: pod.Name, labelPodUID: string(pod.UID),
		labelCommit: string(req.Commit),
	}
	if req.Class != "" {
		opts.Labels[labelStorageClass] = req.Class
	}
	return opts
}

// layoutMismatchMessage explains a cache of another layout than the
// volume's: without a class, a CSI volume is of the overlay layout.
func layoutMismatchMessage(req kit.VolumeRequest, err error) string {
	if req.Class == "" {
		return fmt.Sprintf("cache %s was made by a StorageClass of another layout, and a CSI inline volume without volumeAttributes %s is of the %s layout: %v; name the cache's StorageClass in volumeAttributes %s, or use another cache",
			req.Cache, kit.AttrStorageClass, layerfs.LayoutOverlay, err, kit.AttrStorageClass)
	}
	return fmt.Sprintf("cache %s was made by a StorageClass of another layout than StorageClass %q (%s): %v; name the cache's StorageClass in volumeAttributes %s, or use another cache",
		req.Cache, req.Class, req.Layout, err, kit.AttrStorageClass)
}

// admittedEvents tell the pod what its class changed of what its
// attributes asked for, as a claim's Events do.
func (p *Provisioner) admittedEvents(pod kit.CSIPod, req kit.VolumeRequest) {
	if req.ForcedRead {
		p.events.Eventf(pod.Object(), nil, corev1.EventTypeNormal, kit.ReasonModeForcedRead, kit.ActionProvision,
			"StorageClass %q makes every volume read-only, so the volume of cache %s is a read view that is never committed, although volumeAttributes %s is %s",
			req.Class, req.Cache, kit.AttrMode, v1alpha1.ModeWrite)
	}
}

// NodeUnpublishVolume unmounts the volume from its target path and ends it
// if its pod's outcome is known: the kubelet unpublishes only once the
// pod's containers have stopped, but may not have reported its phase yet;
// then the pod watch ends it when the phase arrives.
func (d *csiDriver) NodeUnpublishVolume(ctx context.Context, r *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := d.checkTarget(r.GetVolumeId(), r.GetTargetPath()); err != nil {
		return nil, err
	}
	id := csiStoreID(r.GetVolumeId())
	unlock := d.locks.lock(id)
	defer unlock()
	if err := unbindTarget(r.GetTargetPath()); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	vol, err := d.prov.store.Volume(ctx, id)
	if errors.Is(err, layerfs.ErrNotFound) {
		return &csi.NodeUnpublishVolumeResponse{}, nil // ended already
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read volume %s: %v", id, err)
	}
	if err := d.ends.endIfDecided(ctx, vol, triggerUnpublish); err != nil {
		return nil, status.Errorf(codes.Internal, "end volume %s of cache %s (its changes are kept; the kubelet retries): %v", id, vol.Cache, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// checkTarget refuses a request without a volume id, or whose target is
// not a clean path below the kubelet's pods directory: the agent mounts
// and removes it as root.
func (d *csiDriver) checkTarget(volumeID, target string) error {
	if volumeID == "" {
		return status.Error(codes.InvalidArgument, "volume id is empty")
	}
	pods := filepath.Join(d.kubeletDir, "pods") + "/"
	if !filepath.IsAbs(target) || filepath.Clean(target) != target || !strings.HasPrefix(target, pods) {
		return status.Errorf(codes.InvalidArgument, "target path %q is not a clean path below %s; is the agent's --kubelet-dir the kubelet's --root-dir?", target, pods)
	}
	return nil
}

// checkPod cross-checks the pod the volume context names with what the
// kubelet and the API server say besides: the target is in that pod's
// directory (the kubelet's pods/<uid>/volumes/...), and the pod of that
// name this node's informer holds, if it holds one yet, has that UID. A
// volume is then never made, held or ended for a pod it does not serve.
func (d *csiDriver) checkPod(pod kit.CSIPod, target string) error {
	rel := strings.TrimPrefix(target, filepath.Join(d.kubeletDir, "pods")+"/")
	if uid, _, _ := strings.Cut(rel, "/"); uid != string(pod.UID) {
		return fmt.Errorf("the target path %s is in the directory of pod UID %q, but the volume context names pod %s with UID %q", target, uid, pod.Key(), pod.UID)
	}
	if got, ok := d.prov.holds.podUID(pod.Key()); ok && got != pod.UID {
		return fmt.Errorf("pod %s has UID %q, but the volume context names UID %q", pod.Key(), got, pod.UID)
	}
	return nil
}

// csiStoreID is the store's name of a CSI volume: the kubelet's ids are
// too long for a store name, and derived ids stay stable across
// restarts.
func csiStoreID(volumeID string) string {
	sum := sha256.Sum256([]byte(volumeID))
	return csiVolumePrefix + hex.EncodeToString(sum[:])[:40]
}

// bindTarget bind-mounts the volume at target, nosuid and nodev, read-only
// if asked; a target that is already a mount is left as it is.
func bindTarget(merged, target string, readOnly bool) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("create target %s: %w", target, err)
	}
	if mounted, err := mountinfo.Mounted(target); err != nil || mounted {
		return err
	}
	if err := unix.Mount(merged, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s at %s: %w", merged, target, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("remount %s nosuid,nodev: %w", target, err)
	}
	return nil
}

// unbindTarget unmounts target and removes it, as CSI asks of the plugin
// that made it. A missing or unmounted target is fine: unpublish is
// retried, and the pod watch may have got there first.
//
// A target still in use is never detached lazily: a process that holds
// a detached mount keeps writing into the volume's upper directory after
// the commit's unmount of the volume itself succeeded, so into the layer
// the commit sealed. It fails with layerfs.ErrBusy instead, and the
// kubelet's retry (or the pod watch's) ends the volume once nothing
// holds it.
func unbindTarget(target string) error {
	for range 8 { // bind mounts may stack after a kubelet retry
		err := unmountWhenFree(target)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmount %s: a process still holds it, so its volume is not ended yet (%w): %w", target, layerfs.ErrBusy, err)
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove target %s: %w", target, err)
	}
	return nil
}

// unmountWhenFree unmounts target, waiting a little (busyWaits) for a
// passer-by (a stat, a du of the kubelet) to let go of it.
func unmountWhenFree(target string) error {
	var err error
	for i := range busyWaits {
		if err = unix.Unmount(target, unix.UMOUNT_NOFOLLOW); !errors.Is(err, unix.EBUSY) {
			return err
		}
		time.Sleep(time.Duration(i+1) * 20 * time.Millisecond)
	}
	return err
}

// busyWaits bounds unmountWhenFree: about a second in all.
const busyWaits = 10

// volumeLocks serialize the calls for one volume: the kubelet's retries,
// its unpublish and the pod watch's end.
type volumeLocks struct {
	mu sync.Mutex
	m  map[string]*volumeLock
}

func newVolumeLocks() *volumeLocks { return &volumeLocks{m: map[string]*volumeLock{}} }

type volumeLock struct {
	sync.Mutex
	users int
}

func (l *volumeLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	v := l.m[id]
	if v == nil {
		v = &volumeLock{}
		l.m[id] = v
	}
	v.users++
	l.mu.Unlock()
	v.Lock()
	return func() {
		v.Unlock()
		l.mu.Lock()
		if v.users--; v.users == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}

// csiRequest admits a CSI volume as a claim is admitted, in a namespace
// that opted in: on the parameters of the StorageClass its storageClass
// attribute names, or else of a class without parameters (a node-local
// overlay cache), which never takes a cache that syncs through a
// registry.
func (p *Provisioner) csiRequest(ctx context.Context, r *csi.NodePublishVolumeRequest, pod kit.CSIPod, limits kit.CSILimits) (kit.VolumeRequest, error) {
	if err := p.caches.CSIOptedIn(ctx, pod.Namespace); err != nil {
		return kit.VolumeRequest{}, err
	}
	attrs := r.GetVolumeContext()
	s, err := kit.CSISettings(attrs, pod, r.GetReadonly(), limits)
	if err != nil {
		return kit.VolumeRequest{}, err
	}
	class, err := kit.CSIClass(attrs, p.storageClass)
	if err != nil {
		return kit.VolumeRequest{}, err
	}
	if class.CSINeedsPod(attrs) {
		got, err := p.getPod(ctx, pod.Namespace, pod.Name)
		if err == nil && got.UID != pod.UID {
			err = apierrors.NewNotFound(corev1.Resource("pods"), pod.Name)
		}
		if err != nil {
			return kit.VolumeRequest{}, fmt.Errorf("get pod %s to evaluate the fallback template of StorageClass %q: %w", pod.Key(), class.Name, err)
		}
		// The kubelet's target is .../volumes/kubernetes.io~csi/<volume>/mount.
		s = s.WithPod(got, filepath.Base(filepath.Dir(r.GetTargetPath())))
	}
	req, err := p.admitVolume(ctx, s, class)
	if err != nil || class.Name != "" {
		return req, err
	}
	return req, p.refuseRegistryCache(ctx, req)
}

// storageClass reads a class from the agent's informer; nil if there is
// none.
func (p *Provisioner) storageClass(name string) (*storagev1.StorageClass, error) {
	class, err := p.classes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return class, err
}

// refuseRegistryCache refuses a CSI volume without a class of a cache
// that syncs through a registry: on a class without parameters it would
// neither pull the published generations first nor publish in step, and
// the node's chain would part from the cluster's.
func (p *Provisioner) refuseRegistryCache(ctx context.Context, req kit.VolumeRequest) error {
	cache, err := p.caches.Get(ctx, req.Cache)
	if err != nil || cache == nil || cache.Status.Published == nil {
		return err
	}
	return &kit.ClaimError{Reason: kit.ReasonRegistryCache, Message: fmt.Sprintf(
		"cache %s syncs across nodes through registry %s, and a CSI inline volume without volumeAttributes %s is node-local; name the cache's StorageClass (label %s on the Cache) in volumeAttributes %s, use a claim of that class, or use another cache",
		req.Cache, cache.Status.Published.Repository, kit.AttrStorageClass, v1alpha1.LabelStorageClass, kit.AttrStorageClass)}
}
