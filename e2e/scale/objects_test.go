//go:build scale

package scale

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"golang.org/x/sync/errgroup"

	"github.com/layercache/layercache/api/v1alpha1"
)

// The simulated cluster: one namespace with one Cache that every node uses.
const (
	namespace = "scale"
	cacheName = "shared"
	// kwokAnnotation marks the Nodes kwok manages (its
	// --manage-nodes-with-annotation-selector).
	kwokAnnotation = "kwok.x-k8s.io/node"
	// workers is how many nodes are set up at once.
	workers = 32
)

// nodeName is the name of simulated node i.
func nodeName(i int) string { return fmt.Sprintf("scale-node-%05d", i) }

// simulation plays every node's agent, the scheduler and the volume binder
// through the API.
type simulation struct {
	c        client.Client
	cacheUID types.UID
	// generations[i] is node i's latest reported generation.
	generations []atomic.Int64
	// applied and failed count the replica updates of the steady state.
	applied, failed atomic.Int64
}

// createCache creates the namespace and the shared Cache.
func createCache(ctx context.Context, c client.Client) (*simulation, error) {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return nil, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	cache := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: cacheName}}
	if err := c.Create(ctx, cache); err != nil {
		return nil, fmt.Errorf("creating Cache %s/%s: %w", namespace, cacheName, err)
	}
	return &simulation{c: c, cacheUID: cache.UID}, nil
}

// addNodes sets up nodes [from, to): each a Node that kwok makes Ready,
// a build pod on it whose generic ephemeral volume's claim is bound to a
// PV shaped like the node agent's, and the node's CacheReplica of the
// shared cache. It returns the number of API writes it made.
func (s *simulation) addNodes(ctx context.Context, n int) (int64, error) {
	s.generations = make([]atomic.Int64, n)
	var writes atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range n {
		g.Go(func() error {
			w, err := s.addNode(ctx, i)
			writes.Add(w)
			return err
		})
	}
	err := g.Wait()
	return writes.Load(), err
}

// addNode makes node i and what runs on it; it returns its writes.
func (s *simulation) addNode(ctx context.Context, i int) (int64, error) {
	node := nodeName(i)
	var writes int64
	create := func(obj client.Object) error {
		writes++
		if err := s.c.Create(ctx, obj); err != nil {
			return fmt.Errorf("node %s: creating %T %s: %w", node, obj, obj.GetName(), err)
		}
		return nil
	}
	if err := create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Labels:      map[string]string{corev1.LabelHostname: node, "type": "kwok"},
		Annotations: map[string]string{kwokAnnotation: "fake"}}}); err != nil {
		return writes, err
	}

	// The build pod, placed on the node (no scheduler), with its cache as
	// a generic ephemeral volume, as CI systems' pods have it.
	podName := fmt.Sprintf("build-%05d", i)
	claimAnn := map[string]string{v1alpha1.AnnotationCache: cacheName}
	class := v1alpha1.StorageClassName
	request := corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: podName, Labels: map[string]string{"app": "build"},
			Finalizers: []string{v1alpha1.FinalizerBuildEnd}},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "build", Image: "build", Command: []string{"make"},
				VolumeMounts: []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}}}},
			Volumes: []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
				VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
					ObjectMeta: metav1.ObjectMeta{Annotations: claimAnn},
					Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class,
						AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
						Resources:   corev1.VolumeResourceRequirements{Requests: request}},
				}}}}},
		},
	}
	if err := create(pod); err != nil {
		return writes, err
	}

	// Its claim, as the ephemeral-volume controller makes it and the
	// scheduler and the binder leave it.
	pvName := "pvc-" + string(uuid.NewUUID())
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: podName + "-cache",
			Annotations: map[string]string{
				v1alpha1.AnnotationCache:                        cacheName,
				"volume.kubernetes.io/selected-node":            node,
				"volume.kubernetes.io/storage-provisioner":      v1alpha1.ProvisionerName,
				"volume.beta.kubernetes.io/storage-provisioner": v1alpha1.ProvisionerName,
				"pv.kubernetes.io/bind-completed":               "yes",
				"pv.kubernetes.io/bound-by-controller":          "yes",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeName: pvName,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: request}},
	}
	if err := create(claim); err != nil {
		return writes, err
	}
	pv := agentPV(pvName, node, claim)
	if err := create(pv); err != nil {
		return writes, err
	}
	pv.Status.Phase = corev1.VolumeBound
	writes++
	if err := s.c.Status().Update(ctx, pv); err != nil {
		return writes, fmt.Errorf("node %s: binding PV %s: %w", node, pv.Name, err)
	}
	claim.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound,
		AccessModes: claim.Spec.AccessModes, Capacity: request}
	writes++
	if err := s.c.Status().Update(ctx, claim); err != nil {
		return writes, fmt.Errorf("node %s: binding claim %s: %w", node, claim.Name, err)
	}
	writes++
	if err := s.applyReplica(ctx, i, time.Now()); err != nil {
		return writes, err
	}
	return writes, nil
}

// agentPV is a PV as the node agent returns it (nodeagent/volumes/pv.go, buildPV),
// bound to claim.
func agentPV(name, node string, claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	dir := corev1.HostPathDirectory
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{v1alpha1.AnnotationNode: node},
			Annotations: map[string]string{
				v1alpha1.AnnotationCache:          namespace + "/" + cacheName,
				v1alpha1.AnnotationMode:           string(v1alpha1.ModeWrite),
				v1alpha1.AnnotationCommit:         string(v1alpha1.CommitOnSuccess),
				v1alpha1.AnnotationBaseGeneration: "1",
				v1alpha1.AnnotationNode:           node,
				"pv.kubernetes.io/provisioned-by": v1alpha1.ProvisionerName,
			},
		},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              v1alpha1.StorageClassName,
			AccessModes:                   claim.Spec.AccessModes,
			Capacity:                      claim.Spec.Resources.Requests,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: "/var/lib/layercache/volumes/" + name + "/merged", Type: &dir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
	}
}

// applyReplica reports node i's next generation of the shared cache, as
// its agent does after a commit: server-side apply of the whole replica
// with the node's field manager.
func (s *simulation) applyReplica(ctx context.Context, i int, now time.Time) error {
	node := nodeName(i)
	gen := s.generations[i].Add(1)
	status := v1alpha1.CacheReplicaStatus{
		Generation: gen,
		Layers:     int32(min(gen, 8)),
		SizeBytes:  1<<30 + gen<<20,
		LastUsed:   &metav1.Time{Time: now.Truncate(time.Second)},
		LastWriter: fmt.Sprintf("%s/build-%05d-%d", namespace, i, gen),
	}
	body := v1alpha1.CacheReplicaApply(namespace, cacheName, s.cacheUID, node, status)
	if err := s.c.Apply(ctx, body, client.FieldOwner("layercache-node-"+node), client.ForceOwnership); err != nil {
		return fmt.Errorf("node %s: applying its CacheReplica: %w", node, err)
	}
	return nil
}

// trickle has every node of [0, n) report a new generation once per
// period, evenly spread, until ctx ends: the steady state's load.
func (s *simulation) trickle(ctx context.Context, n int, period time.Duration) {
	interval := period / time.Duration(n)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	idx := make(chan int, workers)
	var wg sync.WaitGroup
	for range workers / 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				if err := s.applyReplica(ctx, i, time.Now()); err != nil {
					if ctx.Err() == nil {
						s.failed.Add(1)
					}
					continue
				}
				s.applied.Add(1)
			}
		}()
	}
	for next := 0; ; next = (next + 1) % n {
		select {
		case <-ctx.Done():
			close(idx)
			wg.Wait()
			return
		case <-tick.C:
		}
		select {
		case idx <- next:
		default:
			s.failed.Add(1) // the API server is behind: the update is dropped
		}
	}
}
