package nodeagent

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/layercache/layercache/nodeagent/kit"
)

// The claim informer holds the claims that may be this node's, whole but
// for their managed fields, and follows claims as the scheduler places
// them: none of another node's claims stays in it.
func TestClaimInformerKeepsThisNodesClaims(t *testing.T) {
	claim := func(name, selected string) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ci", Name: name, UID: types.UID("uid-" + name),
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			Annotations:   map[string]string{"example.com/big": "..."},
		}}
		if selected != "" {
			c.Annotations[kit.AnnSelectedNode] = selected
		}
		return c
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	clientset := fake.NewClientset(claim("mine", "node-a"), claim("unplaced", ""), claim("theirs", "node-b"))
	f := newClaimInformers(clientset, "node-a", 0)
	lister := f.Core().V1().PersistentVolumeClaims().Lister()
	f.Start(ctx.Done())
	defer func() { cancel(); f.Shutdown() }()
	f.WaitForCacheSync(ctx.Done())

	cached := func() []string {
		list, err := lister.List(labels.Everything())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range list {
			if c.ManagedFields != nil || c.Annotations["example.com/big"] == "" {
				t.Errorf("claim %s cached as %+v, want it whole but for its managed fields", c.Name, c.ObjectMeta)
			}
			names = append(names, c.Name)
		}
		slices.Sort(names)
		return names
	}
	// waitCached waits until the cache holds exactly want: a watch event
	// arrives after its write returned.
	waitCached := func(step string, want ...string) {
		t.Helper()
		for ctx.Err() == nil {
			if got := cached(); slices.Equal(got, want) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: cached claims %v, want %v", step, cached(), want)
	}
	update := func(c *corev1.PersistentVolumeClaim) {
		t.Helper()
		if _, err := clientset.CoreV1().PersistentVolumeClaims("ci").Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create := func(c *corev1.PersistentVolumeClaim) {
		t.Helper()
		if _, err := clientset.CoreV1().PersistentVolumeClaims("ci").Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	waitCached("listed", "mine", "unplaced")
	update(claim("unplaced", "node-b"))
	waitCached("the unplaced claim placed on another node", "mine")
	update(claim("theirs", "node-a"))
	waitCached("another node's claim placed here instead", "mine", "theirs")
	create(claim("new-theirs", "node-b"))
	create(claim("new-mine", "node-a")) // watched after new-theirs: once it is here, new-theirs was passed by
	waitCached("created", "mine", "new-mine", "theirs")
}
