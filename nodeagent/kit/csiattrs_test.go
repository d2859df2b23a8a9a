package kit

import (
	"errors"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit/kittest"
)

func TestCSIClass(t *testing.T) {
	registry := kittest.Class(map[string]string{ParamRegistry: "registry.example/caches", ParamRegistrySecret: "creds", ParamSyncTimeout: "30s", "uid": "1000"})
	registry.Name = "shared"
	other := kittest.Class(nil)
	other.Name, other.Provisioner = "ebs", "ebs.csi.aws.com"
	immediate := storagev1.VolumeBindingImmediate
	eager := kittest.Class(nil)
	eager.Name, eager.VolumeBindingMode = "eager", &immediate
	badParam := kittest.Class(map[string]string{"uid": "root"})
	badParam.Name = "bad-uid"
	snapshot := kittest.Class(map[string]string{ParamLayout: string(layerfs.LayoutSnapshot)})
	snapshot.Name = "snap"
	classes := map[string]*storagev1.StorageClass{}
	for _, c := range []*storagev1.StorageClass{registry, other, eager, badParam, snapshot} {
		classes[c.Name] = c
	}
	get := func(name string) (*storagev1.StorageClass, error) {
		if name == "api-down" {
			return nil, errors.New("connection refused")
		}
		return classes[name], nil
	}

	tests := []struct {
		name       string
		attrs      map[string]string
		check      func(t *testing.T, c ClassParams)
		wantReason string // "" means success
		wantErr    []string
	}{
		{name: "no attribute: a class without parameters", attrs: map[string]string{AttrCache: "maven"},
			check: func(t *testing.T, c ClassParams) {
				if c.Name != "" || c.Registry != nil || c.Layout != "" {
					t.Errorf("class %+v, want the zero class", c)
				}
			}},
		{name: "a registry class applies as to a claim", attrs: map[string]string{AttrStorageClass: "shared"},
			check: func(t *testing.T, c ClassParams) {
				if c.Name != "shared" || c.UID != 1000 || c.Registry == nil || c.Registry.Prefix != "registry.example/caches" ||
					c.Registry.Secret != "creds" || c.Registry.SyncTimeout != 30*time.Second {
					t.Errorf("class %+v (registry %+v), want class shared's parameters", c, c.Registry)
				}
			}},
		{name: "a snapshot class", attrs: map[string]string{AttrStorageClass: "snap"},
			check: func(t *testing.T, c ClassParams) {
				if c.Layout != layerfs.LayoutSnapshot {
					t.Errorf("layout %q, want snapshot", c.Layout)
				}
			}},
		{name: "missing class", attrs: map[string]string{AttrStorageClass: "nope"}, wantReason: ReasonInvalidAttribute,
			wantErr: []string{`volumeAttributes storageClass names StorageClass "nope", which does not exist`, "layercache.dev/node", "remove the attribute"}},
		{name: "another provisioner's class", attrs: map[string]string{AttrStorageClass: "ebs"}, wantReason: ReasonInvalidAttribute,
			wantErr: []string{`StorageClass "ebs" of provisioner "ebs.csi.aws.com", not of layercache.dev/node`}},
		{name: "empty name", attrs: map[string]string{AttrStorageClass: ""}, wantReason: ReasonInvalidAttribute,
			wantErr: []string{`volumeAttributes storageClass has value ""`, "not a StorageClass name"}},
		{name: "not a name", attrs: map[string]string{AttrStorageClass: "Shared_1"}, wantReason: ReasonInvalidAttribute,
			wantErr: []string{`volumeAttributes storageClass has value "Shared_1"`}},
		{name: "a class claims would refuse", attrs: map[string]string{AttrStorageClass: "eager"}, wantReason: ReasonInvalidStorageClass,
			wantErr: []string{`StorageClass "eager"`, "volumeBindingMode is Immediate"}},
		{name: "a bad parameter", attrs: map[string]string{AttrStorageClass: "bad-uid"}, wantReason: ReasonInvalidStorageClass,
			wantErr: []string{`StorageClass "bad-uid"`, "uid"}},
		{name: "an API failure is no refusal", attrs: map[string]string{AttrStorageClass: "api-down"},
			wantErr: []string{`read StorageClass "api-down"`, "connection refused"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := CSIClass(tt.attrs, get)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				tt.check(t, c)
				return
			}
			if err == nil {
				t.Fatalf("CSIClass = %+v, want an error", c)
			}
			var refused *ClaimError
			switch {
			case tt.wantReason == "" && errors.As(err, &refused):
				t.Errorf("error %v is a refusal (%s), want an API error to retry", err, refused.Reason)
			case tt.wantReason != "" && (!errors.As(err, &refused) || refused.Reason != tt.wantReason):
				t.Errorf("error %v, want a refusal with reason %s", err, tt.wantReason)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestCSISettingsKnowsStorageClass(t *testing.T) {
	pod := CSIPod{Namespace: "ci", Name: "build", UID: "uid-build"}
	limits := CSILimits{Default: 1 << 30, Max: 2 << 30}
	if _, err := CSISettings(map[string]string{AttrCache: "maven", AttrStorageClass: "shared"}, pod, false, limits); err != nil {
		t.Fatalf("storageClass is a known attribute: %v", err)
	}
	_, err := CSISettings(map[string]string{AttrCache: "maven", "class": "shared"}, pod, false, limits)
	if err == nil || !strings.Contains(err.Error(), "fallback and storageClass") {
		t.Fatalf("unknown attribute: %v, want the valid ones listed with storageClass", err)
	}
}
