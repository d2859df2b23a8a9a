package nodeagent

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestDefaultOptionsFromEnv(t *testing.T) {
	t.Setenv(EnvRoot, "/srv/layercache")
	t.Setenv(EnvNodeName, "node-a")
	o := DefaultOptions()
	if o.Root != "/srv/layercache" || o.NodeName != "node-a" {
		t.Errorf("DefaultOptions root %q node %q, want the environment's", o.Root, o.NodeName)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("defaults with a node name must be valid: %v", err)
	}

	t.Setenv(EnvRoot, "")
	if o := DefaultOptions(); o.Root != "/var/lib/layercache" {
		t.Errorf("DefaultOptions root %q without env, want /var/lib/layercache", o.Root)
	}
}

func TestOptionsFlags(t *testing.T) {
	o := DefaultOptions()
	fs := pflag.NewFlagSet("node", pflag.ContinueOnError)
	o.AddFlags(fs)
	err := fs.Parse([]string{"--node-name=node-b", "--root=/data/lc", "--gc-max-size=2Gi", "--gc-max-age=72h", "--max-layers=8", "--resync-interval=30s", "--metrics-bind-address=0",
		"--gc-min-free=20Gi", "--gc-min-free-percent=12.5"})
	if err != nil {
		t.Fatal(err)
	}
	if o.NodeName != "node-b" || o.Root != "/data/lc" || o.GCMaxBytes != 2<<30 || o.GCMaxAge != 72*time.Hour ||
		o.MaxLayers != 8 || o.ResyncInterval != 30*time.Second || o.MetricsBindAddress != "0" ||
		o.GCMinFreeBytes != 20<<30 || o.GCMinFreePercent != 12.5 {
		t.Errorf("flags not applied: %+v", o)
	}
	if err := fs.Parse([]string{"--gc-max-size=lots"}); err == nil || !strings.Contains(err.Error(), "100Gi") {
		t.Errorf("bad size: error %v, want one suggesting a quantity", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	valid := func() Options {
		o := DefaultOptions()
		o.NodeName = "node-a"
		o.Root = "/var/lib/layercache"
		return o
	}
	tests := []struct {
		name   string
		change func(*Options)
		want   []string // substrings of the error; none means valid
	}{
		{name: "valid", change: func(*Options) {}},
		{name: "probes disabled", change: func(o *Options) { o.MetricsBindAddress, o.HealthProbeBindAddress = "0", "0" }},
		{name: "no node", change: func(o *Options) { o.NodeName = "" }, want: []string{"pass --node-name or set NODE_NAME"}},
		{name: "bad node", change: func(o *Options) { o.NodeName = "Node_A" }, want: []string{`node name "Node_A"`}},
		{name: "relative root", change: func(o *Options) { o.Root = "var/lib/layercache" }, want: []string{"not an absolute path"}},
		{name: "empty root", change: func(o *Options) { o.Root = "" }, want: []string{"--root is empty"}},
		{name: "bad metrics address", change: func(o *Options) { o.MetricsBindAddress = "8080" }, want: []string{`--metrics-bind-address "8080"`}},
		{name: "bad probe port", change: func(o *Options) { o.HealthProbeBindAddress = ":http" }, want: []string{"--health-probe-bind-address"}},
		{name: "max layers", change: func(o *Options) { o.MaxLayers = 0 }, want: []string{"--max-layers 0"}},
		{name: "negative gc", change: func(o *Options) { o.GCMaxAge, o.GCMaxBytes = -time.Hour, -1 }, want: []string{"--gc-max-age", "--gc-max-size"}},
		{name: "free space", change: func(o *Options) { o.GCMinFreeBytes, o.GCMinFreePercent = -1, 100 }, want: []string{"--gc-min-free -1", "--gc-min-free-percent 100"}},
		{name: "free space off", change: func(o *Options) { o.GCMinFreeBytes, o.GCMinFreePercent = 0, 0 }},
		{name: "resync", change: func(o *Options) { o.ResyncInterval = time.Millisecond }, want: []string{"--resync-interval"}},
		{name: "snapshot image too small", change: func(o *Options) { o.SnapshotImageBytes = 512 << 20 }, want: []string{"--snapshot-image-size 536870912 is too small"}},
		{name: "all problems at once", change: func(o *Options) { o.NodeName, o.Root = "", "" }, want: []string{"--root", "--node-name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid()
			tt.change(&o)
			err := o.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", o)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
