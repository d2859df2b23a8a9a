package overlay

import (
	"slices"
	"strings"
	"testing"
)

func TestMountSpecOptions(t *testing.T) {
	tests := []struct {
		name  string
		spec  Spec
		want  string
		flags string
	}{
		{
			name:  "volume",
			spec:  Spec{Lower: []string{"/r/layers/b", "/r/layers/a"}, Upper: "/r/v/upper", Work: "/r/v/work"},
			want:  "lowerdir=/r/layers/b:/r/layers/a,upperdir=/r/v/upper,workdir=/r/v/work,index=off,redirect_dir=off,metacopy=off,volatile",
			flags: "nosuid,nodev",
		},
		{
			name:  "volume of a cache that needs set-id programs and devices",
			spec:  Spec{Lower: []string{"/r/layers/a"}, Upper: "/r/v/upper", Work: "/r/v/work", AllowSetuid: true, AllowDevices: true},
			want:  "lowerdir=/r/layers/a,upperdir=/r/v/upper,workdir=/r/v/work,index=off,redirect_dir=off,metacopy=off,volatile",
			flags: "",
		},
		{
			name:  "read-only view for squash",
			spec:  Spec{Lower: []string{"/r/layers/b", "/r/layers/a"}},
			want:  "lowerdir=/r/layers/b:/r/layers/a,index=off,redirect_dir=off,metacopy=off",
			flags: "ro,nosuid,nodev",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.spec.data(); got != tt.want {
				t.Errorf("data() = %q, want %q", got, tt.want)
			}
			cmd := tt.spec.Command("/mnt")
			opts := tt.want
			if tt.flags != "" {
				opts = tt.flags + "," + opts
			}
			if !strings.HasPrefix(cmd, "mount -t overlay overlay -o "+opts) || !strings.HasSuffix(cmd, " /mnt") {
				t.Errorf("command() = %q", cmd)
			}
		})
	}
}

// Options are last-wins in the kernel: the self-containment features must
// come after everything else.
func TestMountSpecFeaturesComeLast(t *testing.T) {
	spec := Spec{Lower: []string{"/a"}, Upper: "/u", Work: "/w"}
	opts, features := spec.options(), spec.features()
	if !slices.Equal(opts[len(opts)-len(features):], features) {
		t.Fatalf("options %v do not end with %v", opts, features)
	}
}

func TestMountSpecValidate(t *testing.T) {
	deep := make([]string, MaxDepth+1)
	for i := range deep {
		deep[i] = "/l"
	}
	tests := []struct {
		name    string
		spec    Spec
		wantErr string
	}{
		{"no layers", Spec{}, "at least one lower layer"},
		{"too deep", Spec{Lower: deep}, "squash the cache"},
		{"at the limit", Spec{Lower: deep[1:]}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.validate()
			if tt.wantErr == "" && err != nil {
				t.Fatalf("validate() = %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
