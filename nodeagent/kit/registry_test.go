package kit

import (
	"strings"
	"testing"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

func TestParseRegistry(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   string // error substring; "" for success
	}{
		{"none", nil, ""},
		{"prefix", map[string]string{ParamRegistry: "reg.example:5000/ci-caches"}, ""},
		{"timeout", map[string]string{ParamRegistry: "reg.example/c", ParamSyncTimeout: "5s"}, ""},
		{"no path", map[string]string{ParamRegistry: "reg.example:5000"}, "HOST[:PORT]/PATH"},
		{"scheme", map[string]string{ParamRegistry: "https://reg.example/c"}, "without a scheme"},
		{"bad timeout", map[string]string{ParamRegistry: "reg.example/c", ParamSyncTimeout: "soon"}, `syncTimeout has value "soon"`},
		{"secret alone", map[string]string{ParamRegistrySecret: "creds"}, "set without registry"},
		{"max layer size", map[string]string{ParamRegistry: "reg.example/c", ParamMaxLayerSize: "20Gi"}, ""},
		{"max layer size in bytes", map[string]string{ParamRegistry: "reg.example/c", ParamMaxLayerSize: "1048576"}, ""},
		{"no layer bound", map[string]string{ParamRegistry: "reg.example/c", ParamMaxLayerSize: "0"}, ""},
		{"negative layer bound", map[string]string{ParamRegistry: "reg.example/c", ParamMaxLayerSize: "-1Gi"}, `maxLayerSize has value "-1Gi": negative; use a size such as 20Gi`},
		{"layer bound not a size", map[string]string{ParamRegistry: "reg.example/c", ParamMaxLayerSize: "lots"}, `maxLayerSize has value "lots": not a quantity`},
		{"layer bound not whole bytes", map[string]string{ParamRegistry: "reg.example/c", ParamMaxLayerSize: "1500m"}, "not a whole number of bytes"},
		{"layer bound alone", map[string]string{ParamMaxLayerSize: "20Gi"}, "maxLayerSize is set without registry"},
		{"mount first", map[string]string{ParamRegistry: "reg.example/c", ParamMountFirst: "true"}, ""},
		{"fetch first", map[string]string{ParamRegistry: "reg.example/c", ParamMountFirst: "false"}, ""},
		{"mount first not a boolean", map[string]string{ParamRegistry: "reg.example/c", ParamMountFirst: "yes"}, `mountFirst has value "yes": use "true"`},
		{"mount first in capitals", map[string]string{ParamRegistry: "reg.example/c", ParamMountFirst: "True"}, `or "false"`},
		{"mount first empty", map[string]string{ParamRegistry: "reg.example/c", ParamMountFirst: ""}, `mountFirst has value ""`},
		{"mount first alone", map[string]string{ParamMountFirst: "false"}, "mountFirst is set without registry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseClass(kittest.Class(tc.params))
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("parseClass: %v, want error containing %q", err, tc.want)
			}
		})
	}
}

// mountFirst is on unless the class turns it off, and a cache's
// registry reference carries it to the pull.
func TestMountFirst(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   bool
	}{
		{"absent", map[string]string{ParamRegistry: "reg.example/c"}, true},
		{"true", map[string]string{ParamRegistry: "reg.example/c", ParamMountFirst: "true"}, true},
		{"false", map[string]string{ParamRegistry: "reg.example/c", ParamMountFirst: "false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseClass(kittest.Class(tc.params))
			if err != nil {
				t.Fatal(err)
			}
			if p.Registry.MountFirst != tc.want {
				t.Errorf("RegistryParams.MountFirst = %v, want %v", p.Registry.MountFirst, tc.want)
			}
			if ref := p.Registry.ForCache(layerfs.CacheRef{Namespace: "ci", Name: "maven"}, 0); ref.MountFirst != tc.want {
				t.Errorf("RegistryRef.MountFirst = %v, want %v", ref.MountFirst, tc.want)
			}
		})
	}
}
