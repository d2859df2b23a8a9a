// Package monitoring holds no Go code: its test keeps the monitoring files
// in step. rules.yaml is the one source of the alerts; prometheusrule.yaml
// carries its groups for the Prometheus Operator, rules_test.yaml tests
// every alert, and dashboard.json selects on the labels the PodMonitors set.
package monitoring

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite prometheusrule.yaml from rules.yaml")

type ruleFile struct {
	Groups []map[string]any `json:"groups"`
}

func readYAML(t *testing.T, path string, into any) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return data
}

// TestPrometheusRuleCarriesRules fails when prometheusrule.yaml's groups
// differ from rules.yaml's: the operator would load alerts promtool never
// tested.
func TestPrometheusRuleCarriesRules(t *testing.T) {
	var rules ruleFile
	rulesData := readYAML(t, "rules.yaml", &rules)
	if *update {
		if err := os.WriteFile("prometheusrule.yaml", prometheusRule(t, rulesData), 0o644); err != nil {
			t.Fatalf("write prometheusrule.yaml: %v", err)
		}
	}
	var pr struct {
		Kind string   `json:"kind"`
		Spec ruleFile `json:"spec"`
	}
	readYAML(t, "prometheusrule.yaml", &pr)
	if pr.Kind != "PrometheusRule" {
		t.Fatalf("prometheusrule.yaml kind = %q, want PrometheusRule", pr.Kind)
	}
	if !reflect.DeepEqual(pr.Spec.Groups, rules.Groups) {
		t.Errorf("prometheusrule.yaml's groups differ from rules.yaml's: run go test ./config/monitoring -update")
	}
}

// prometheusRule returns prometheusrule.yaml's text: its header and
// metadata, then rules.yaml's groups indented under spec.
func prometheusRule(t *testing.T, rulesData []byte) []byte {
	t.Helper()
	old, err := os.ReadFile("prometheusrule.yaml")
	if err != nil {
		t.Fatalf("read prometheusrule.yaml: %v", err)
	}
	head, _, ok := bytes.Cut(old, []byte("\nspec:\n"))
	if !ok {
		t.Fatalf("prometheusrule.yaml has no spec line")
	}
	_, groups, ok := bytes.Cut(rulesData, []byte("\ngroups:\n"))
	if !ok {
		t.Fatalf("rules.yaml has no groups line")
	}
	var out bytes.Buffer
	out.Write(head)
	out.WriteString("\nspec:\n  groups:\n")
	for line := range strings.SplitSeq(strings.TrimRight(string(groups), "\n"), "\n") {
		if line != "" {
			line = "  " + line
		}
		out.WriteString(line + "\n")
	}
	return out.Bytes()
}

// TestEveryAlertHasATestCase fails for an alert rules_test.yaml never
// evaluates: promtool test rules passes on alerts it is not asked about.
func TestEveryAlertHasATestCase(t *testing.T) {
	var rules ruleFile
	readYAML(t, "rules.yaml", &rules)
	var tests struct {
		Tests []struct {
			Name   string `json:"name"`
			Alerts []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	readYAML(t, "rules_test.yaml", &tests)
	fired := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.Alerts {
			if len(a.ExpAlerts) > 0 {
				fired[a.Alertname] = true
			}
		}
	}
	for _, name := range AlertNames(t, rules) {
		if !fired[name] {
			t.Errorf("alert %s: no case in rules_test.yaml expects it to fire", name)
		}
	}
}

// AlertNames lists rules.yaml's alerts in order.
func AlertNames(t *testing.T, rules ruleFile) []string {
	t.Helper()
	var names []string
	for _, g := range rules.Groups {
		list, _ := g["rules"].([]any)
		for _, r := range list {
			name, _ := r.(map[string]any)["alert"].(string)
			if name == "" {
				t.Errorf("group %v: a rule without an alert name", g["name"])
				continue
			}
			names = append(names, name)
		}
	}
	return names
}

// TestDashboardSelectsScrapedJobs fails for a dashboard query that selects
// no job the PodMonitors set: it would draw nothing.
func TestDashboardSelectsScrapedJobs(t *testing.T) {
	data, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatalf("read dashboard.json: %v", err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("parse dashboard.json: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard.json has no panels")
	}
	for _, p := range dash.Panels {
		for i, target := range p.Targets {
			if !strings.Contains(target.Expr, `job="layercache-node"`) && !strings.Contains(target.Expr, `job="layercache-manager"`) {
				t.Errorf("panel %q query %d selects no layercache job: %s", p.Title, i, target.Expr)
			}
		}
	}
}
