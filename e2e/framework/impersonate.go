package framework

import "k8s.io/client-go/rest"

// AsLayercache is f's config impersonating layercache's service account
// account (layercache-node or layercache-manager) of SystemNamespace;
// node, when set, is the node its token names, as the API server writes
// into a pod's token (Kubernetes 1.32 and later). Admission policies tell
// the components apart by exactly these.
func (f *Framework) AsLayercache(account, node string) *rest.Config {
	cfg := rest.CopyConfig(f.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + SystemNamespace + ":" + account,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + SystemNamespace, "system:authenticated"},
	}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	}
	return cfg
}

// AsUser is f's config impersonating user, an ordinary authenticated
// user: a tenant, with whatever Roles the test binds to that name.
func (f *Framework) AsUser(user string) *rest.Config {
	cfg := rest.CopyConfig(f.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	return cfg
}
