//go:build scale

package scale

import (
	"maps"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]float64 // verb -> sum of apiserver_request_total writes
	}{
		{"plain", `# HELP apiserver_request_total x
apiserver_request_total{code="201",resource="pods",verb="POST"} 3
apiserver_request_total{code="200",resource="pods",verb="GET"} 9
apiserver_request_total{code="200",resource="cachereplicas",verb="APPLY"} 2.5e+01
`, map[string]float64{"pods": 3, "cachereplicas": 25}},
		{"escaped quote and comma in a value", `apiserver_request_total{resource="a\",b",verb="PATCH"} 1`, map[string]float64{`a",b`: 1}},
		{"no labels", `apiserver_request_total 7`, map[string]float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseMetrics([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if got := m.by("apiserver_request_total", "resource", isWrite("verb")); !maps.Equal(got, tc.want) {
				t.Errorf("writes by resource = %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := parseMetrics([]byte(`x{a="1"`)); err == nil {
		t.Error("an unterminated series parsed")
	}
}
