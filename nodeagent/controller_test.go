package nodeagent

import (
	"context"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
	"github.com/layercache/layercache/nodeagent/kit"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
	"github.com/layercache/layercache/nodeagent/volumes"
)

// TestControllerTwoNodes runs the provisioner library's controller for two
// node agents against one fake API: each provisions only the claims placed
// on its node, and the owner commits the volume when the PV is released.
func TestControllerTwoNodes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	class := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: "layercache"}, Provisioner: v1alpha1.ProvisionerName,
		VolumeBindingMode: &wffc, Parameters: map[string]string{"uid": "1000"},
	}
	clientset := k8sfake.NewClientset(class)
	scheme, err := bootstrap.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	cacheClient := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.Cache{}).Build()

	stores := map[string]*kittest.FakeStore{}
	recorders := map[string]*events.FakeRecorder{}
	for _, node := range []string{"node-a", "node-b"} {
		st, recorder := kittest.NewFakeStore(), events.NewFakeRecorder(100)
		stores[node], recorders[node] = st, recorder
		opts := DefaultOptions()
		opts.NodeName = node
		opts.ResyncInterval = time.Hour
		// Never the host's store: run mounts the mount gate's tmpfs
		// below the root.
		opts.Root = t.TempDir()
		t.Cleanup(func() { _ = unix.Unmount(filepath.Join(opts.Root, volumes.GateDir), unix.MNT_DETACH) })
		metrics, err := kit.NewMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		claimInformers := newClaimInformers(clientset, node, controller.DefaultResyncPeriod)
		a, err := newAgent(opts, agentParts{
			store: st, caches: &kit.Caches{Client: cacheClient, Reader: cacheClient, Node: node}, events: recorder, metrics: metrics,
			hostname: node, kube: clientset, claimInformers: claimInformers,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.wire(ctx, clientset, prometheus.NewRegistry()); err != nil {
			t.Fatal(err)
		}
		go func() {
			if err := a.run(ctx); err != nil {
				t.Errorf("agent %s: %v", node, err)
			}
		}()
	}

	claim := func(name string, ann map[string]string) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ci", Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{
				kit.AnnSelectedNode:                        "node-a",
				"volume.kubernetes.io/storage-provisioner": v1alpha1.ProvisionerName,
			},
		}}
		maps.Copy(c.Annotations, ann)
		c.Spec.StorageClassName = &class.Name
		c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
		return c
	}
	for _, c := range []*corev1.PersistentVolumeClaim{
		claim("good", map[string]string{v1alpha1.AnnotationCache: "maven"}),
		claim("bad", map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: "sometimes"}),
	} {
		if _, err := clientset.CoreV1().PersistentVolumeClaims("ci").Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var pv *corev1.PersistentVolume
	poll(t, ctx, "PV of the good claim", func() bool {
		var err error
		pv, err = clientset.CoreV1().PersistentVolumes().Get(ctx, "pvc-uid-good", metav1.GetOptions{})
		return err == nil
	})
	if pv.Annotations[v1alpha1.AnnotationNode] != "node-a" || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Name != "good" {
		t.Errorf("PV %s: node %q claimRef %v, want node-a's PV bound to ci/good", pv.Name, pv.Annotations[v1alpha1.AnnotationNode], pv.Spec.ClaimRef)
	}
	var warnings []string
	poll(t, ctx, "event on the bad claim", func() bool {
		for len(recorders["node-a"].Events) > 0 {
			warnings = append(warnings, <-recorders["node-a"].Events)
		}
		for _, w := range warnings {
			if strings.HasPrefix(w, "Warning InvalidAnnotation") && strings.Contains(w, "layercache.dev/commit") {
				return true
			}
		}
		return false
	})
	if _, err := clientset.CoreV1().PersistentVolumes().Get(ctx, "pvc-uid-bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the bad claim got a PV (err %v)", err)
	}

	// The pod succeeded, the manager recorded it and released the claim.
	pv.Annotations[v1alpha1.AnnotationPodOutcome] = v1alpha1.OutcomeSucceeded
	pv.Status.Phase = corev1.VolumeReleased
	if _, err := clientset.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "commit and PV deletion", func() bool {
		_, err := clientset.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(stores["node-a"].Committed()) == 1
	})
	poll(t, ctx, "node-a's replica at generation 1", func() bool {
		var list v1alpha1.CacheReplicaList
		if err := cacheClient.List(ctx, &list); err != nil {
			return false
		}
		return len(list.Items) == 1 && list.Items[0].Spec.Node == "node-a" && list.Items[0].Status.Generation == 1
	})

	if b := stores["node-b"]; b.MountCount() != 0 || len(b.Committed()) != 0 {
		t.Errorf("node-b touched node-a's claim: %d mounts, commits %v", b.MountCount(), b.Committed())
	}
}

// poll waits for cond, failing the test after a generous bound; it is a
// wait for asynchronous controllers, not a measurement.
func poll(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
