//go:build envtest

package cachemanager

// The envtest suite runs the manager's controllers against a real
// kube-apiserver and etcd (controller-runtime's envtest), started once for
// the package on free loopback ports. What the fake client only imitates is
// real here: admission (the API server adds kubernetes.io/pvc-protection to
// every claim), finalizers holding a deleted object, status subresources,
// validation against the CRD, resourceVersion conflicts, server-side apply
// field ownership, and RBAC: the manager runs as a user bound to the
// ClusterRole that `make generate` writes from its +kubebuilder:rbac markers.
//
// There is no kube-controller-manager, scheduler or kubelet. The tests play
// them (and the node agents, and the users) through the API: they bind
// claims to PVs, set pods' phases through the status subresource, and apply
// CacheReplicas the way a node agent does. Nothing collects
// garbage and no namespace finishes deleting, so each test deletes what it
// made.
//
// Run it with `make test-envtest`, which prepares the binaries.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/layercache/layercache/internal/envtestassets"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/bootstrap"
)

// managerUser is the identity the manager runs as in the suite, bound to
// config/rbac/manager's ClusterRole.
const managerUser = "layercache-manager"

// Timeouts of the suite's waits. Every controller reacts within
// milliseconds; the margins absorb a busy 2-core machine.
const (
	pollInterval = 50 * time.Millisecond
	waitTimeout  = 30 * time.Second
	// quietPeriod is how long a test watches for a write that must not
	// come, after a sentinel proved that the controller has handled events
	// that came later.
	quietPeriod = time.Second
)

var (
	testScheme *runtime.Scheme
	// adminConfig is the cluster admin's: the tests' own client, which
	// plays the kubelet, the PV controller, node agents and users.
	adminConfig *rest.Config
	// managerConfig authenticates as managerUser.
	managerConfig *rest.Config
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

// runSuite starts the API server, runs the tests and stops the API server
// whatever happened. A missing binary fails the suite with how to get it:
// skipping would let `make test` pass without testing the manager.
func runSuite(m *testing.M) int {
	// The controllers log through each test's manager (see logTo); this
	// silences controller-runtime's warning about its unset global logger.
	ctrl.SetLogger(logr.Discard())

	assets, err := envtestassets.Dir("test-envtest")
	if err != nil {
		fmt.Fprintf(os.Stderr, "envtest: %v\n", err)
		return 1
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "envtest: stopping kube-apiserver and etcd: %v\n", err)
		}
	}()
	if err != nil {
		fmt.Fprintf(os.Stderr, "envtest: starting kube-apiserver and etcd from %s: %v\n", assets, err)
		return 1
	}
	if err := prepareCluster(env, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "envtest: %v\n", err)
		return 1
	}
	return m.Run()
}

// prepareCluster makes what every test expects: the scheme, the
// StorageClasses, and the manager's user with the generated ClusterRole.
func prepareCluster(env *envtest.Environment, cfg *rest.Config) error {
	var err error
	if testScheme, err = bootstrap.Scheme(); err != nil {
		return err
	}
	adminConfig = cfg
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		return fmt.Errorf("creating the admin client: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	for _, sc := range []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.StorageClassName}, Provisioner: v1alpha1.ProvisionerName, VolumeBindingMode: &wffc},
		{ObjectMeta: metav1.ObjectMeta{Name: "standard"}, Provisioner: "rancher.io/local-path", VolumeBindingMode: &wffc},
	} {
		if err := c.Create(ctx, sc); err != nil {
			return fmt.Errorf("creating StorageClass %s: %w", sc.Name, err)
		}
	}

	role, err := generatedClusterRole(filepath.Join("..", "config", "rbac", "manager", "role.yaml"))
	if err != nil {
		return err
	}
	if err := c.Create(ctx, role); err != nil {
		return fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: managerUser}},
	}
	if err := c.Create(ctx, binding); err != nil {
		return fmt.Errorf("binding ClusterRole %s to user %s: %w", role.Name, managerUser, err)
	}
	user, err := env.AddUser(envtest.User{Name: managerUser}, cfg)
	if err != nil {
		return fmt.Errorf("adding user %s: %w", managerUser, err)
	}
	managerConfig = user.Config()
	return nil
}

// generatedClusterRole reads the ClusterRole from the RBAC that make
// generate writes (the file also holds the leader election Role, which the
// suite does not need: it runs without leader election).
func generatedClusterRole(path string) (*rbacv1.ClusterRole, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the manager's RBAC: %w", err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s has no ClusterRole; run make generate", path)
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal(doc, &role); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		if role.Kind == "ClusterRole" {
			return &role, nil
		}
	}
}

// apiTest is one test's view of the API server: its namespace, an admin
// client that reads past any cache, and the manager it started.
type apiTest struct {
	t   *testing.T
	ctx context.Context
	c   client.Client
	ns  string
	// writes records every write request the manager sent.
	writes *writeLog
	// metrics is the registry the manager's metrics went to.
	metrics *prometheus.Registry
	// lifecycle is what startManager passes to Setup; DefaultLifecycle
	// unless the test sets it first.
	lifecycle Lifecycle
	// clusterScoped lists the PVs and Nodes the test made, for cleanup.
	clusterScoped []client.Object
}

// newAPITest makes a namespace for the test and deletes everything in it
// at the end. Tests run one after another: each starts its own manager,
// which must be alone in reconciling what the test made.
func newAPITest(t *testing.T) *apiTest {
	t.Helper()
	c, err := client.New(adminConfig, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatalf("creating the admin client: %v", err)
	}
	a := &apiTest{t: t, ctx: context.Background(), c: c, lifecycle: Lifecycle{CacheMaxAge: DefaultCacheMaxAge}}
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "envtest-"}}
	if err := c.Create(a.ctx, namespace); err != nil {
		t.Fatalf("creating the test's namespace: %v", err)
	}
	a.ns = namespace.Name
	t.Cleanup(func() {
		if err := a.cleanup(namespace); err != nil {
			t.Errorf("cleaning up namespace %s: %v", a.ns, err)
		}
	})
	return a
}

// cleanup deletes what the test made. Finalizers are removed first: no
// controller is left to lift them. The namespace itself stays Terminating
// (envtest runs no namespace controller) but takes no new objects.
func (a *apiTest) cleanup(namespace *corev1.Namespace) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var errs []error
	var objs []client.Object
	for _, list := range []client.ObjectList{&corev1.PodList{}, &corev1.PersistentVolumeClaimList{}, &v1alpha1.CacheList{}} {
		if err := a.c.List(ctx, list, client.InNamespace(a.ns)); err != nil {
			errs = append(errs, fmt.Errorf("listing %T: %w", list, err))
			continue
		}
		items, err := metaItems(list)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, items...)
	}
	objs = append(objs, a.clusterScoped...)
	for _, obj := range objs {
		if err := a.forceDelete(ctx, obj); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.c.Delete(ctx, namespace); client.IgnoreNotFound(err) != nil {
		errs = append(errs, fmt.Errorf("deleting namespace: %w", err))
	}
	return errors.Join(errs...)
}

func metaItems(list client.ObjectList) ([]client.Object, error) {
	var out []client.Object
	switch l := list.(type) {
	case *corev1.PodList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *corev1.PersistentVolumeClaimList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *v1alpha1.CacheList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	default:
		return nil, fmt.Errorf("cleanup cannot list %T", list)
	}
	return out, nil
}

// forceDelete removes obj's finalizers and deletes it at once.
func (a *apiTest) forceDelete(ctx context.Context, obj client.Object) error {
	if len(obj.GetFinalizers()) > 0 {
		patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
		obj.SetFinalizers(nil)
		if err := a.c.Patch(ctx, obj, patch); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("removing the finalizers of %T %s: %w", obj, obj.GetName(), err)
		}
	}
	if err := a.c.Delete(ctx, obj, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// startManager runs the manager's controllers, as `layercache manager`
// does (cachemanager.Setup on a controller-runtime manager with
// CacheOptions), as managerUser, until the test ends.
func (a *apiTest) startManager() {
	a.t.Helper()
	a.writes = &writeLog{}
	cfg := rest.CopyConfig(managerConfig)
	cfg.Wrap(a.writes.wrap)
	logs := &lockedBuffer{}
	skipNameValidation := true // a manager per test registers the same controller names
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 testScheme,
		Cache:                  CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Logger:                 funcr.New(logs.logLine, funcr.Options{Verbosity: 1}),
		Controller:             config.Controller{SkipNameValidation: &skipNameValidation},
	})
	if err != nil {
		a.t.Fatalf("creating the manager: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.metrics = prometheus.NewRegistry()
	if err := Setup(ctx, mgr, a.metrics, a.lifecycle); err != nil {
		cancel()
		a.t.Fatalf("Setup: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	// Registered after the namespace's cleanup, so it runs first: the
	// manager stops before the test's objects are torn down.
	a.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			a.t.Errorf("manager: %v", err)
		}
		if a.t.Failed() {
			a.t.Logf("manager log:\n%s", logs.String())
		}
	})
}

// lockedBuffer collects a manager's log lines; they are shown when the test
// fails.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) logLine(prefix, args string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprintf(&b.buf, "%s %s %s\n", time.Now().Format("15:04:05.000"), prefix, args)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// writeLog records the manager's write requests as "METHOD PATH".
type writeLog struct {
	mu     sync.Mutex
	writes []string
}

func (w *writeLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		switch req.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			w.mu.Lock()
			w.writes = append(w.writes, req.Method+" "+req.URL.Path)
			w.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

// to returns the writes to the object at path or its subresources.
func (w *writeLog) to(path string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, s := range w.writes {
		_, p, _ := strings.Cut(s, " ")
		if p == path || strings.HasPrefix(p, path+"/") {
			out = append(out, s)
		}
	}
	return out
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// eventually polls cond until it holds; on timeout the test fails with
// what was awaited and cond's last complaint.
func (a *apiTest) eventually(what string, cond func(ctx context.Context) error) {
	a.t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(a.ctx, pollInterval, waitTimeout, true, func(context.Context) (bool, error) {
		// Not the poll's context, so that the last complaint is about the
		// condition, not about the deadline.
		last = cond(a.ctx)
		return last == nil, nil
	})
	if err != nil {
		a.t.Fatalf("waiting %s for %s: %v (last: %v)", waitTimeout, what, err, last)
	}
}

// stays checks cond for quietPeriod and fails the test the first time it
// does not hold.
func (a *apiTest) stays(what string, cond func(ctx context.Context) error) {
	a.t.Helper()
	var broken error
	err := wait.PollUntilContextTimeout(a.ctx, pollInterval, quietPeriod, true, func(context.Context) (bool, error) {
		// Not the poll's context: a read cut off by its deadline is no
		// broken condition.
		broken = cond(a.ctx)
		return broken != nil, nil
	})
	switch {
	case err == nil:
		a.t.Fatalf("%s: %v", what, broken)
	case !wait.Interrupted(err):
		a.t.Fatalf("%s: %v", what, err)
	}
}

// counter returns the value of the manager's counter name with the given
// outcome label (0 if it was never counted).
func (a *apiTest) counter(name, outcome string) float64 {
	a.t.Helper()
	families, err := a.metrics.Gather()
	if err != nil {
		a.t.Fatalf("gathering the manager's metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// events returns "Type Reason Note" of the Events about the named object of
// kind in the test's namespace, oldest first.
func (a *apiTest) events(ctx context.Context, kind, name string) ([]string, error) {
	var list eventsv1.EventList
	if err := a.c.List(ctx, &list, client.InNamespace(a.ns)); err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	slices.SortStableFunc(list.Items, func(x, y eventsv1.Event) int { return x.EventTime.Compare(y.EventTime.Time) })
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name {
			out = append(out, e.Type+" "+e.Reason+" "+e.Note)
		}
	}
	return out, nil
}

// waitEvent waits for an Event about the object whose "Type Reason Note"
// starts with prefix.
func (a *apiTest) waitEvent(kind, name, prefix string) {
	a.t.Helper()
	a.eventually(fmt.Sprintf("an Event %q about %s %s", prefix, kind, name), func(ctx context.Context) error {
		evs, err := a.events(ctx, kind, name)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if strings.HasPrefix(e, prefix) {
				return nil
			}
		}
		return fmt.Errorf("events so far: %q", evs)
	})
}

// get reads obj again from the API server; NotFound is returned as is.
func (a *apiTest) get(ctx context.Context, obj client.Object) error {
	return a.c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
}

// gone reports nil once obj no longer exists.
func (a *apiTest) gone(obj client.Object) func(context.Context) error {
	return func(ctx context.Context) error {
		cur := obj.DeepCopyObject().(client.Object)
		err := a.get(ctx, cur)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		default:
			return fmt.Errorf("%s still exists (deleting: %v, finalizers %v)", cur.GetName(), cur.GetDeletionTimestamp() != nil, cur.GetFinalizers())
		}
	}
}
