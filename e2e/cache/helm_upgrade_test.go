//go:build e2e && faults

package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/layercache/layercache/e2e/framework"
)

// helmRelease is the release make e2e installs (e2e/cluster/up.sh,
// --deploy helm).
const helmRelease = "layercache"

// TestHelmUpgradeKeepsCaches: a cache committed on the previous chart
// version (charts/testdata, as a chart repository serves it) is kept by
// the upgrade to this one, which also changes the node agents' pods
// (every agent restarts): the CRD and the Cache are the same objects
// (same UIDs: not deleted and recreated), the cache keeps its
// generation, and the next build reads the files. It restarts every node
// agent, so it runs alone with the faults (make e2e-faults), on a cluster
// installed with the chart (make e2e-up).
func TestHelmUpgradeKeepsCaches(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	const cacheName = "upgraded"
	charts := filepath.Join("..", "..", "charts")
	current := filepath.Join(charts, "layercache")
	// The previous version's package (charts' TestPreviousVersionIsPackaged
	// keeps it the only one).
	packages, err := filepath.Glob(filepath.Join(charts, "testdata", "layercache-*.tgz"))
	if err != nil || len(packages) != 1 {
		t.Fatalf("charts/testdata holds %q (%v), want the previous chart version's package", packages, err)
	}
	previous := packages[0]
	previousChart := strings.TrimSuffix(filepath.Base(previous), ".tgz")

	helm := filepath.Join("..", "..", "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("no helm at %s (%v): make e2e-up builds it (make bin/helm)", helm, err)
	}
	run := func(ctx context.Context, args ...string) string {
		t.Helper()
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, helm, args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	if out := run(ctx, "status", helmRelease, "--namespace", framework.SystemNamespace); !bytes.Contains([]byte(out), []byte("STATUS: deployed")) {
		t.Fatalf("layercache is not a deployed Helm release (make e2e-up installs it with --deploy helm):\n%s", out)
	}
	// Each upgrade gives the e2e cluster's values, as make e2e-up does. A
	// log level changes the agents' pod template. Not the manager's: on
	// the local cluster it shares the host's ports, so a rolling update's
	// new pod can never start beside the old one (e2e/cluster/up.sh
	// replaces its pod instead), and helm's --wait timed out on it in a
	// CI rehearsal.
	upgrade := func(ctx context.Context, chart string, set ...string) {
		args := []string{"upgrade", helmRelease, chart, "--namespace", framework.SystemNamespace,
			"--values", filepath.Join(current, "ci", "e2e-values.yaml"), "--wait", "--timeout", "3m"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		run(ctx, args...)
	}
	// The scenario's context is done by the time the cleanup runs; the
	// cleanup puts the cluster back as make e2e-up left it (another
	// rollout, which the next fault waits out as it waits for its agent).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		upgrade(ctx, current)
	})
	upgrade(ctx, previous)
	if got := releaseChart(ctx, t, run); got != previousChart {
		t.Fatalf("the release runs chart %s after the install of %s", got, previous)
	}

	e.runPod(ctx, e.cachePod("before", cacheAnnotations(cacheName), "echo kept > /cache/file"), corev1.PodSucceeded)
	e.expectVolumeEnd(ctx, "before", "Committed")
	before := e.waitGeneration(ctx, cacheName, 1)
	crd := crdMetadata(ctx, t, e)
	agent := e.agentPod(ctx)

	start := time.Now()
	upgrade(ctx, current, "node.logLevel=debug")
	e.waitAgentReady(ctx, string(agent.UID), agentRestartTimeout)
	t.Logf("helm upgrade from %s to %s and the agents' rollout took %s", previousChart, releaseChart(ctx, t, run), time.Since(start).Round(time.Second))

	if crdAfter := crdMetadata(ctx, t, e); crdAfter.UID != crd.UID {
		t.Errorf("the Cache CRD was recreated by the upgrade (UID %s, was %s): every Cache went with it", crdAfter.UID, crd.UID)
	}
	after, err := e.cache(ctx, cacheName)
	if err != nil {
		t.Fatalf("Cache %s after the upgrade: %v", cacheName, err)
	}
	if after.UID != before.UID || after.Status.Generation != before.Status.Generation {
		t.Errorf("Cache %s after the upgrade: UID %s generation %d, want the same object (%s) at generation %d",
			cacheName, after.UID, after.Status.Generation, before.UID, before.Status.Generation)
	}

	e.runPod(ctx, e.cachePod("after", cacheAnnotations(cacheName), "cat /cache/file"), corev1.PodSucceeded)
	if got := e.logs(ctx, "after"); got != "kept\n" {
		t.Errorf("the build after the upgrade read %q from the cache, want %q", got, "kept\n")
	}
}

// releaseChart is the chart (name-version) the release runs now.
func releaseChart(ctx context.Context, t *testing.T, run func(context.Context, ...string) string) string {
	t.Helper()
	var releases []struct {
		Name  string `json:"name"`
		Chart string `json:"chart"`
	}
	out := run(ctx, "list", "--namespace", framework.SystemNamespace, "--output", "json")
	if err := json.Unmarshal([]byte(out), &releases); err != nil {
		t.Fatalf("helm list's output %q: %v", out, err)
	}
	for _, r := range releases {
		if r.Name == helmRelease {
			return r.Chart
		}
	}
	t.Fatalf("helm list shows no release %s: %s", helmRelease, out)
	return ""
}

// crdMetadata reads the Cache CRD's metadata (the scenario's scheme has no
// CRD type; the metadata is all it compares).
func crdMetadata(ctx context.Context, t *testing.T, e *env) *metav1.PartialObjectMetadata {
	t.Helper()
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	if err := e.Caches.Get(ctx, client.ObjectKey{Name: "caches.layercache.dev"}, crd); err != nil {
		t.Fatalf("reading the Cache CRD: %v", err)
	}
	return crd
}
