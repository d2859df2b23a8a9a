//go:build envtest

package config

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
	"github.com/layercache/layercache/internal/envtestassets"
)

// TestAgentStatePolicyOnARealAPIServer applies the package's CRDs and
// ValidatingAdmissionPolicy layercache-agent-state to a real kube-apiserver
// (make test-envtest) and checks what a tenant with a wildcard Role of the
// layercache.dev group may write (issue 33, finding 6): its Cache's status
// without status.published, never status.published nor a CacheReplica;
// the node agents' service account writes both. The e2e suite checks the
// same on the cluster (e2e/cache TestATenantCannotForgeAgentState); this
// one catches a policy the API server refuses, or whose expressions fail,
// without one.
func TestAgentStatePolicyOnARealAPIServer(t *testing.T) {
	assets, err := envtestassets.Dir("test-envtest")
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{"crd"}, BinaryAssetsDirectory: assets, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop kube-apiserver and etcd: %v", err)
		}
	})
	scheme, err := bootstrap.Scheme()
	must(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin := clientAs(t, cfg, scheme, "")
	r := render(t, "default")
	for _, name := range []string{"layercache-agent-state"} {
		must(t, admin.Create(ctx, find[*admissionregistrationv1.ValidatingAdmissionPolicy](t, r, name)))
		must(t, admin.Create(ctx, find[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, r, name)))
	}
	const ns, agentName = "team", "system:serviceaccount:" + namespace + ":layercache-node"
	must(t, admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	must(t, admin.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "all"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"*"}, Verbs: []string{"*"}}}}))
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "all"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "all"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "tenant"}, {APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: agentName}}}))
	cache := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "maven"}}
	must(t, admin.Create(ctx, cache))
	tenant, agent := clientAs(t, cfg, scheme, "tenant"), clientAs(t, cfg, scheme, agentName)

	patchStatus := func(as client.Client, change func(*v1alpha1.CacheStatus)) error {
		var cur v1alpha1.Cache
		if err := as.Get(ctx, client.ObjectKeyFromObject(cache), &cur); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(cur.DeepCopy(), client.MergeFromWithOptimisticLock{})
		change(&cur.Status)
		return as.Status().Patch(ctx, &cur, patch)
	}
	publish := func(repo string) func(*v1alpha1.CacheStatus) {
		return func(s *v1alpha1.CacheStatus) { s.Published = &v1alpha1.PublishedChain{Repository: repo} }
	}
	replica := func(as client.Client) error {
		b := v1alpha1.CacheReplicaApply(ns, cache.Name, cache.UID, "node-a", v1alpha1.CacheReplicaStatus{Generation: 7})
		return as.Apply(ctx, b, client.FieldOwner("layercache-node-node-a"), client.ForceOwnership)
	}
	// The API server takes a moment to load a new policy: the first
	// refusal of a tenant's write is the sign that it has.
	const refused = "written by the layercache node agents only"
	for range 100 {
		err = patchStatus(tenant, publish("127.0.0.1:9/a/team/maven"))
		if err != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), refused) {
		t.Fatalf("a tenant sets status.published of a Cache without status: %v, want the policy's refusal", err)
	}
	for _, tt := range []struct {
		name    string
		do      func() error
		refused bool
	}{
		{"the agent sets status.published", func() error { return patchStatus(agent, publish("127.0.0.1:9/b/team/maven")) }, false},
		{"the tenant changes status.published", func() error { return patchStatus(tenant, publish("127.0.0.1:9/c/team/maven")) }, true},
		{"the tenant removes status.published", func() error { return patchStatus(tenant, func(s *v1alpha1.CacheStatus) { s.Published = nil }) }, true},
		{"the tenant writes another status field", func() error { return patchStatus(tenant, func(s *v1alpha1.CacheStatus) { s.Generation = 5 }) }, false},
		{"the tenant applies a CacheReplica", func() error { return replica(tenant) }, true},
		{"the agent applies a CacheReplica", func() error { return replica(agent) }, false},
	} {
		err := tt.do()
		switch {
		case !tt.refused && err != nil:
			t.Errorf("%s: %v, want it allowed", tt.name, err)
		case tt.refused && (err == nil || !strings.Contains(err.Error(), refused)):
			t.Errorf("%s: %v, want the policy's refusal (%q)", tt.name, err, refused)
		}
	}
}

// clientAs is a client that impersonates user; "" is the admin.
func clientAs(t *testing.T, cfg *rest.Config, scheme *runtime.Scheme, user string) client.Client {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	if user != "" {
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	must(t, err)
	return c
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
