//go:build e2e && monitoring

// Package monitoring runs Debian's prometheus binary on loopback against
// the local cluster's node agents and manager, with config/monitoring's
// rules, and checks that what the alerts and the dashboard select exists.
package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/e2e/framework"
)

const scrapeInterval = 5 * time.Second

// TestEveryRuleAndPanelSelectsRealSeries scrapes the cluster and fails
// for a metric an alert or a dashboard query names that no component
// exposes: a renamed metric would silence an alert. Many series exist
// only while a cache does (its bytes on a node, its namespace's total
// and bound) or after an event since the agent started (a miss, a hit),
// so the test makes them: two builds of one cache, in a namespace with
// a size bound. Without them it depended on what earlier tests had left
// (a CI rehearsal after the other packages, which delete their
// namespaces, found three metrics without series).
func TestEveryRuleAndPanelSelectsRealSeries(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	f := framework.New(t)
	boundNamespace(ctx, t, f, "1Gi")
	for _, build := range []string{"miss", "hit"} {
		pod := cachePod(t, f, build, "echo "+build+" > /cache/"+build)
		if _, err := f.CreatePod(ctx, pod); err != nil {
			t.Fatalf("create build pod %s: %v", build, err)
		}
		if _, err := f.WaitForPodPhase(ctx, pod.Name, corev1.PodSucceeded); err != nil {
			t.Fatalf("build pod %s: %v", build, err)
		}
	}
	prom := startPrometheus(ctx, t, f, rulesFile(t))
	prom.waitForTargets(ctx, t)

	exprs := map[string]string{}
	for name, expr := range ruleExprs(t) {
		exprs["rule "+name] = expr
	}
	for name, expr := range dashboardExprs(t) {
		exprs["panel "+name] = expr
	}
	var metrics []string
	for _, expr := range exprs {
		metrics = append(metrics, metricNames(expr)...)
	}
	slices.Sort(metrics)
	counts := prom.waitForSeries(ctx, t, slices.Compact(metrics))
	// rate() needs two samples of each series.
	time.Sleep(2 * scrapeInterval)
	for _, name := range slices.Sorted(maps.Keys(exprs)) {
		expr := exprs[name]
		// The expression itself must evaluate: promtool checked its syntax,
		// this checks it against the server's functions and real types.
		result, err := prom.query(ctx, expr)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var seen []string
		for _, metric := range metricNames(expr) {
			seen = append(seen, fmt.Sprintf("%s=%d", metric, counts[metric]))
		}
		t.Logf("%s: %d result series now; %s", name, len(result), strings.Join(seen, " "))
	}
}

// bornOfAnEvent are the metrics whose labelled series a component creates
// only when an event happens that the test does not make (a vector with
// no series is not exposed), and that event: their absence is no sign of
// a renamed metric. Every other metric must have series.
var bornOfAnEvent = map[string]string{
	"layercache_announced_wait_seconds_count": "at a node's first wait for announced layers since its agent started",
}

// waitForSeries waits until each of metrics has series, up to a minute
// (the manager sums a namespace's caches after the agents report them),
// fails for those that have none then, and returns each one's count. An
// alert's threshold or a failure reason may select none on a healthy
// cluster; its metric may not.
func (p *prometheus) waitForSeries(ctx context.Context, t *testing.T, metrics []string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	deadline := time.Now().Add(time.Minute)
	for {
		var missing []string
		needed := 0 // missing, and not born of an event the test does not make
		for _, metric := range metrics {
			series, err := p.query(ctx, fmt.Sprintf(`{__name__=%q}`, metric))
			if err != nil {
				t.Fatalf("%s: %v", metric, err)
			}
			counts[metric] = len(series)
			if len(series) == 0 {
				missing = append(missing, metric)
				if _, ok := bornOfAnEvent[metric]; !ok {
					needed++
				}
			}
		}
		if needed == 0 || time.Now().After(deadline) {
			for _, metric := range missing {
				if why, ok := bornOfAnEvent[metric]; ok {
					t.Logf("no series of %s yet: it appears %s", metric, why)
				} else {
					t.Errorf("no series of %s on the cluster, a minute after two builds of a cache", metric)
				}
			}
			return counts
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for series of %v: %v", missing, ctx.Err())
		case <-time.After(scrapeInterval):
		}
	}
}

// boundNamespace sets the test namespace's cache size bound, so that the
// manager reports it (layercache_namespace_max_cache_bytes).
func boundNamespace(ctx context.Context, t *testing.T, f *framework.Framework, bound string) {
	t.Helper()
	ns, err := f.Client.CoreV1().Namespaces().Get(ctx, f.Namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	metav1.SetMetaDataAnnotation(&ns.ObjectMeta, v1alpha1.AnnotationMaxCacheSize, bound)
	if _, err := f.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("annotate Namespace %s with %s: %v", f.Namespace, v1alpha1.AnnotationMaxCacheSize, err)
	}
}

// cachePod is a build pod on the first node that runs script over cache
// "monitoring", a claim of the registry's class: its commit is published.
func cachePod(t *testing.T, f *framework.Framework, name, script string) *corev1.Pod {
	t.Helper()
	if f.Cluster.Registry == nil {
		t.Fatal("the cluster has no registry in cluster.json: start it with make e2e-up")
	}
	class := f.Cluster.Registry.StorageClass
	pod := framework.BusyboxPod(name, "sh", "-c", script)
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: f.Cluster.Nodes[0].Name}
	pod.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
		Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationCache: "monitoring"}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &class,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceStorage: resource.MustParse("1Gi"),
				}},
			},
		}},
	}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}}
	return pod
}

// metricNames are the metric names expr selects (up and layercache_*).
func metricNames(expr string) []string {
	names := regexp.MustCompile(`\b(up|layercache_[a-z_]+)\b`).FindAllString(expr, -1)
	slices.Sort(names)
	return slices.Compact(names)
}

// rulesFile is config/monitoring/rules.yaml's absolute path.
func rulesFile(t *testing.T) string {
	t.Helper()
	rules, err := filepath.Abs("../../config/monitoring/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

func ruleExprs(t *testing.T) map[string]string {
	t.Helper()
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	data, err := os.ReadFile("../../config/monitoring/rules.yaml")
	if err != nil {
		t.Fatalf("read the rules: %v", err)
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatalf("parse the rules: %v", err)
	}
	exprs := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
		}
	}
	return exprs
}

// dashboardExprs are the dashboard's queries with Grafana's variables
// replaced as "All" and a 1m rate interval would.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile("../../config/monitoring/dashboard.json")
	if err != nil {
		t.Fatalf("read the dashboard: %v", err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("parse the dashboard: %v", err)
	}
	vars := strings.NewReplacer("$node", ".*", "$cache", ".*", "$__rate_interval", "1m")
	exprs := map[string]string{}
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			exprs[p.Title+" "+target.RefID] = vars.Replace(target.Expr)
		}
	}
	return exprs
}

type prometheus struct {
	url     string
	targets int
}

// startPrometheus runs prometheus on a free loopback port, scraping the
// node agents and the manager where the local cluster binds them (their
// node's address on lo, config/e2e), labelled as config/monitoring's
// PodMonitors label them.
func startPrometheus(ctx context.Context, t *testing.T, f *framework.Framework, rules string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus is missing (Debian's prometheus package; e2e/cluster/host-packages.sh installs it): %v", err)
	}
	pods, err := f.Client.CoreV1().Pods(framework.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=layercache"})
	if err != nil {
		t.Fatalf("list the layercache pods: %v", err)
	}
	type staticConfig struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var static []staticConfig
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		job := "layercache-" + p.Labels["app.kubernetes.io/component"]
		port := 0
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == "metrics" {
					port = int(cp.ContainerPort)
				}
			}
		}
		if port == 0 {
			t.Fatalf("pod %s has no port named metrics", p.Name)
		}
		static = append(static, staticConfig{
			Targets: []string{net.JoinHostPort(p.Status.HostIP, strconv.Itoa(port))},
			Labels:  map[string]string{"job": job, "node": p.Spec.NodeName, "pod": p.Name},
		})
	}
	if len(static) < 2 {
		t.Fatalf("found %d running layercache pods, want the node agents and the manager", len(static))
	}
	dir := t.TempDir()
	config := map[string]any{
		"global":     map[string]any{"scrape_interval": scrapeInterval.String(), "evaluation_interval": scrapeInterval.String()},
		"rule_files": []string{rules},
		"scrape_configs": []any{map[string]any{
			// One job name for Prometheus; each target's job label wins.
			"job_name":       "layercache",
			"honor_labels":   true,
			"static_configs": static,
		}},
	}
	data, err := yaml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackPort(t)
	cmd := exec.CommandContext(ctx, bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			log, _ := os.ReadFile(logFile.Name())
			t.Logf("prometheus log:\n%s", log)
		}
	})
	return &prometheus{url: "http://" + addr, targets: len(static)}
}

// freeLoopbackPort returns a loopback address the kernel had free; 9090 is
// Argo's on the e2e cluster.
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitForTargets waits until every target was scraped and is up.
func (p *prometheus) waitForTargets(ctx context.Context, t *testing.T) {
	t.Helper()
	for {
		series, err := p.query(ctx, `up == 1`)
		if err == nil && len(series) == p.targets {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %d targets up (last: %d, %v): %v", p.targets, len(series), err, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

// query runs an instant query and returns its vector.
func (p *prometheus) query(ctx context.Context, expr string) ([]sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query %q: decode: %w", expr, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, body.Error)
	}
	var vector []sample
	if body.Data.ResultType == "vector" {
		if err := json.Unmarshal(body.Data.Result, &vector); err != nil {
			return nil, fmt.Errorf("query %q: decode vector: %w", expr, err)
		}
	}
	return vector, nil
}
