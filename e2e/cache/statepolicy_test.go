//go:build e2e

package cache

import (
	"context"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestATenantCannotForgeAgentState (issue 33, finding 6): a tenant whose
// Role grants everything of the layercache.dev group in its namespace
// (the common wildcard Role) writes its Cache's spec, but the API server
// refuses its status.published and its CacheReplicas
// (ValidatingAdmissionPolicy layercache-agent-state); the node agents'
// service account still writes both.
func TestATenantCannotForgeAgentState(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	c := &v1alpha1.Cache{ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: "forged"}}
	if err := e.Caches.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	user := "tenant-" + e.Namespace
	e.bindWildcardRole(ctx, user)
	tenant, agent := e.clientFor(e.AsUser(user)), e.clientFor(e.AsLayercache("layercache-node", e.Node.Name))

	// The manager and the agents write the Cache too: a conflict is
	// theirs, not the policy's answer, so the write is tried again.
	setPublished := func(as client.Client, repo string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cur v1alpha1.Cache
			if err := as.Get(ctx, client.ObjectKeyFromObject(c), &cur); err != nil {
				return err
			}
			patch := client.MergeFromWithOptions(cur.DeepCopy(), client.MergeFromWithOptimisticLock{})
			// A chain without layers: nothing for any agent to fetch, and a
			// repository that no class names (the agents refuse to touch it
			// when the Cache goes), on loopback all the same.
			cur.Status.Published = &v1alpha1.PublishedChain{Repository: repo}
			return as.Status().Patch(ctx, &cur, patch)
		})
	}
	setReaders := func(as client.Client) error {
		var cur v1alpha1.Cache
		if err := as.Get(ctx, client.ObjectKeyFromObject(c), &cur); err != nil {
			return err
		}
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Spec.Readers = []string{"team-b"}
		return as.Patch(ctx, &cur, patch)
	}
	applyReplica := func(as client.Client) error {
		b := v1alpha1.CacheReplicaApply(c.Namespace, c.Name, c.UID, e.Node.Name, v1alpha1.CacheReplicaStatus{Generation: 7})
		return as.Apply(ctx, b, client.FieldOwner("layercache-node-"+e.Node.Name), client.ForceOwnership)
	}
	const refused = "written by the layercache node agents only"
	for _, tt := range []struct {
		name    string
		do      func() error
		refused string // "" when allowed
	}{
		{"the tenant writes its Cache's spec", func() error { return setReaders(tenant) }, ""},
		{"the tenant points status.published at a repository", func() error { return setPublished(tenant, "127.0.0.1:9/trusted/"+e.Namespace+"/forged") }, refused},
		{"the tenant speaks for a node", func() error { return applyReplica(tenant) }, refused},
		{"the node agent writes status.published", func() error { return setPublished(agent, "127.0.0.1:9/e2e/"+e.Namespace+"/forged") }, ""},
		{"the tenant changes the agent's chain", func() error { return setPublished(tenant, "127.0.0.1:9/other/"+e.Namespace+"/forged") }, refused},
	} {
		err := tt.do()
		switch {
		case tt.refused == "" && err != nil:
			t.Errorf("%s: %v, want it allowed", tt.name, err)
		case tt.refused != "" && (err == nil || !strings.Contains(err.Error(), tt.refused)):
			t.Errorf("%s: %v, want the policy's refusal (%q)", tt.name, err, tt.refused)
		case tt.refused != "":
			t.Logf("%s: refused: %v", tt.name, err)
		}
	}
}

// bindWildcardRole gives user every verb on every resource of the
// layercache.dev group in the test's namespace.
func (e *env) bindWildcardRole(ctx context.Context, user string) {
	e.t.Helper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "layercache-all"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	}
	if _, err := e.Client.RbacV1().Roles(e.Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "layercache-all"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := e.Client.RbacV1().RoleBindings(e.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}
