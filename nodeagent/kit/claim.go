package kit

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/podfacts"
)

// StorageClass parameters.
const (
	paramUID  = "uid"
	paramGID  = "gid"
	paramMode = "mode"
	// paramAllowSetuid and paramAllowDevices ("true") mount the class's
	// volumes without nosuid or nodev, for the rare cache that must hold
	// working set-id programs or device nodes. StorageClasses are the
	// cluster admin's, so builds cannot ask for it themselves.
	paramAllowSetuid  = "allowSetuid"
	paramAllowDevices = "allowDevices"
	// ParamLayout chooses how the class's volumes are made: "overlay" (the
	// default) or "snapshot" (btrfs subvolumes, for image builders' stores
	// and a size limit that holds during the build).
	ParamLayout = "layout"
)

// VolumeRequest is what a claim and its class ask for, validated.
type VolumeRequest struct {
	Cache  layerfs.CacheRef
	Mode   v1alpha1.Mode
	Commit v1alpha1.CommitPolicy
	// ForcedRead is set when the class turned an explicit write into a read.
	ForcedRead bool
	UID, GID   int
	Perm       os.FileMode
	Writer     string
	// AllowSetuid and AllowDevices come from the class.
	AllowSetuid, AllowDevices bool
	// LimitBytes is the claim's storage request: the most the build may
	// add to the cache.
	LimitBytes int64
	// Registry is where the cache syncs across nodes; nil for a
	// node-local cache.
	Registry *RegistryRef
	// Layout is the class's volume layout.
	Layout layerfs.Layout
	// Class names the claim's StorageClass, which a Cache created for the
	// claim is labelled with (v1alpha1.LabelStorageClass).
	Class string
	// Fallbacks are the caches to start from while Cache has no
	// generation (fallback.go).
	Fallbacks []layerfs.CacheRef
	// FallbackRepositories are the registry repositories of fallbacks
	// whose layers' digests are blobs there (the registry sync seeds from them).
	FallbackRepositories map[layerfs.CacheRef]string
}

func (r VolumeRequest) MountOptions() layerfs.MountOptions {
	return layerfs.MountOptions{
		Cache: r.Cache, ReadOnly: r.Mode == v1alpha1.ModeRead,
		UID: r.UID, GID: r.GID, Mode: r.Perm, Writer: r.Writer,
		AllowSetuid: r.AllowSetuid, AllowDevices: r.AllowDevices, LimitBytes: r.LimitBytes,
		Layout: r.Layout, Fallbacks: r.Fallbacks, FallbackRepositories: r.FallbackRepositories,
	}
}

// ClassParams are a StorageClass's parameters, validated.
type ClassParams struct {
	Name      string
	UID, GID  int
	Perm      os.FileMode
	ForceRead bool
	// AllowSetuid and AllowDevices lift nosuid and nodev.
	AllowSetuid, AllowDevices bool
	// CacheTemplate names the cache of claims without the cache
	// annotation; nil if the class has none.
	CacheTemplate *cacheTemplate
	// FallbackTemplate lists the fallbacks of claims without the
	// fallback annotation; nil if the class has none.
	FallbackTemplate *cacheTemplate
	// Registry syncs the class's caches across nodes; nil for node-local
	// caches.
	Registry *RegistryParams
	Layout   layerfs.Layout
}

// NeedsPod tells whether a claim's settings need its owning pod
// (ClaimSettings): a template of the class names its cache or fallbacks.
func (c ClassParams) NeedsPod(claim *corev1.PersistentVolumeClaim) bool {
	_, annotated := claim.Annotations[v1alpha1.AnnotationCache]
	_, fallbacks := claim.Annotations[v1alpha1.AnnotationFallback]
	return (c.CacheTemplate != nil && !annotated) || (c.FallbackTemplate != nil && !fallbacks)
}

// ParseClass validates the class: late binding, no mount options, and known
// parameters with valid values.
func ParseClass(class *storagev1.StorageClass) (ClassParams, error) {
	p := ClassParams{Name: class.Name}
	if class.VolumeBindingMode == nil || *class.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		mode := storagev1.VolumeBindingImmediate
		if class.VolumeBindingMode != nil {
			mode = *class.VolumeBindingMode
		}
		return p, classError(class.Name, "volumeBindingMode is %s, but a layercache volume lives on the node that runs its pod; recreate the class with volumeBindingMode: WaitForFirstConsumer", mode)
	}
	if len(class.MountOptions) > 0 {
		return p, classError(class.Name, "mountOptions %q are set, but layercache volumes are hostPath volumes, which take no mount options; remove mountOptions from the class", class.MountOptions)
	}
	var unknown []string
	for k := range class.Parameters {
		if !slices.Contains([]string{paramUID, paramGID, paramMode, ParamCache, paramAllowSetuid, paramAllowDevices, ParamRegistry, ParamRegistrySecret, ParamSyncTimeout, ParamMaxLayerSize, ParamMountFirst, ParamLayout, ParamFallback, v1alpha1.ParamClusterMaxAge}, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return p, classError(class.Name, "unknown parameters %q; the valid parameters are cache, fallback, uid, gid, mode, allowSetuid, allowDevices, layout, registry, registrySecret, syncTimeout, maxLayerSize, mountFirst and clusterMaxAge", unknown)
	}
	// The manager applies clusterMaxAge; checking it here refuses a class
	// whose value the manager would have to ignore.
	if v, ok := class.Parameters[v1alpha1.ParamClusterMaxAge]; ok {
		if _, err := v1alpha1.ParseClusterMaxAge(v); err != nil {
			return p, classError(class.Name, "parameter %v", err)
		}
	}
	var err error
	if p.Registry, err = ParseRegistry(class); err != nil {
		return p, err
	}
	if p.Layout, err = parseLayout(class.Name, class.Parameters[ParamLayout]); err != nil {
		return p, err
	}
	if p.Registry != nil {
		p.Registry.Layout = p.Layout
	}
	if p.FallbackTemplate, err = parseFallbackClass(class.Name, class.Parameters); err != nil {
		return p, err
	}
	if text, ok := class.Parameters[ParamCache]; ok {
		if p.CacheTemplate, err = parseCacheTemplate(class.Name, text); err != nil {
			return p, err
		}
	}
	if p.UID, err = parseID(class.Name, paramUID, class.Parameters[paramUID]); err != nil {
		return p, err
	}
	if p.GID, err = parseID(class.Name, paramGID, class.Parameters[paramGID]); err != nil {
		return p, err
	}
	if p.AllowSetuid, err = parseBool(class.Name, paramAllowSetuid, class.Parameters[paramAllowSetuid]); err != nil {
		return p, err
	}
	if p.AllowDevices, err = parseBool(class.Name, paramAllowDevices, class.Parameters[paramAllowDevices]); err != nil {
		return p, err
	}
	switch v := class.Parameters[paramMode]; v {
	case "":
	case string(v1alpha1.ModeRead):
		p.ForceRead = true
	default:
		perm, err := strconv.ParseUint(v, 8, 32)
		if err != nil || perm > 0o7777 {
			return p, classError(class.Name, "parameter mode has value %q: use an octal permission of the volume root such as \"0775\", or \"read\" to make every volume of the class a read-only view", v)
		}
		// Mode 0 would read as "default" to the store; a volume root nobody
		// may enter is never what a class means, so refuse it.
		if perm&0o777 == 0 {
			return p, classError(class.Name, "parameter mode has value %q, which lets nobody use the volume; use a permission such as \"0775\"", v)
		}
		if perm&0o7000 != 0 {
			return p, classError(class.Name, "parameter mode has value %q: setuid, setgid and sticky bits are not supported on the volume root; use a permission such as \"0775\"", v)
		}
		p.Perm = os.FileMode(perm)
	}
	return p, nil
}

// parseLayout validates the layout parameter.
func parseLayout(class, value string) (layerfs.Layout, error) {
	if value == "" {
		return "", nil // the store's default, overlay
	}
	layout, err := layerfs.ParseLayout(value)
	if err != nil {
		return "", classError(class, "parameter %s has value %q: use %q (the default) or %q", ParamLayout, value, layerfs.LayoutOverlay, layerfs.LayoutSnapshot)
	}
	return layout, nil
}

func parseBool(class, key, value string) (bool, error) {
	switch value {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, classError(class, "parameter %s has value %q: use \"true\" or \"false\" (the default)", key, value)
}

func parseID(class, key, value string) (int, error) {
	if value == "" {
		return 0, nil
	}
	id, err := strconv.ParseUint(value, 10, 31)
	if err != nil {
		return 0, classError(class, "parameter %s has value %q: use a numeric id >= 0, for example %s: \"1000\"", key, value, key)
	}
	return int(id), nil
}

// mode is the mode the volume asks for, by default write to a cache of
// its own namespace and read of another's. A class that forces reads turns
// a write into a read; forced tells whether the volume asked for that
// write.
func (s Settings) mode(ref layerfs.CacheRef, class ClassParams) (mode v1alpha1.Mode, forced bool, err error) {
	own := ref.Namespace == s.Namespace
	asked, _ := s.get(v1alpha1.AnnotationMode)
	switch {
	case asked == "" && own:
		mode = v1alpha1.ModeWrite
	case asked == "":
		mode = v1alpha1.ModeRead
	default:
		if mode, err = v1alpha1.ParseMode(asked); err != nil {
			return "", false, s.refused(err, " (the default is write in the cache's own namespace and read for another namespace's cache)")
		}
		if mode == v1alpha1.ModeWrite && !own {
			return "", false, &ClaimError{Reason: s.reason,
				Message: fmt.Sprintf("%s is %q, but cache %s belongs to namespace %q and a %s may only read another namespace's cache; set %s: %s, or use a cache of namespace %q",
					s.field(v1alpha1.AnnotationMode), asked, ref, ref.Namespace, s.holder, s.key(v1alpha1.AnnotationMode), v1alpha1.ModeRead, s.Namespace)}
		}
	}
	if class.ForceRead && mode == v1alpha1.ModeWrite {
		return v1alpha1.ModeRead, asked != "", nil
	}
	return mode, false, nil
}

// commit is the commit policy the volume asks for, by default
// CommitOnSuccess.
func (s Settings) commit() (v1alpha1.CommitPolicy, error) {
	asked, _ := s.get(v1alpha1.AnnotationCommit)
	if asked == "" {
		return v1alpha1.CommitOnSuccess, nil
	}
	policy, err := v1alpha1.ParseCommitPolicy(asked)
	if err != nil {
		return "", s.refused(err, " (the default is "+string(v1alpha1.CommitOnSuccess)+")")
	}
	return policy, nil
}

// writerOf names who will write through the volume: the pod that owns a
// generic ephemeral volume's claim, else the claim itself.
func writerOf(claim *corev1.PersistentVolumeClaim) string {
	if pod, ok := podfacts.OwningPod(claim); ok {
		return claim.Namespace + "/" + pod.Name
	}
	return claim.Namespace + "/" + claim.Name
}

// readerGranted tells whether a Cache lets namespace read it.
func readerGranted(cache *v1alpha1.Cache, namespace string) bool {
	return slices.Contains(cache.Spec.Readers, namespace)
}

// AnnSelectedNode is set by the scheduler on a late-binding claim.
const AnnSelectedNode = "volume.kubernetes.io/selected-node"
