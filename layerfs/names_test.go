package layerfs

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		value  string
		reason string // empty: valid
	}{
		{"maven", ""},
		{"a", ""},
		{"go-build-2", ""},
		{strings.Repeat("a", 63), ""},
		{"", "empty"},
		{strings.Repeat("a", 64), "64 characters"},
		{"..", "'..'"},
		{"a/b", "path separator"},
		{"/etc", "path separator"},
		{`a\b`, "path separator"},
		{"Maven", "upper-case"},
		{"-maven", "starts or ends"},
		{"maven-", "starts or ends"},
		{"ma_ven", "characters other than"},
		{"ma.ven", "characters other than"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			err := ValidateName("cache", tt.value)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("ValidateName(%q) = %v, want nil", tt.value, err)
				}
				return
			}
			var invalid *InvalidNameError
			if !errors.As(err, &invalid) {
				t.Fatalf("ValidateName(%q) = %v, want *InvalidNameError", tt.value, err)
			}
			msg := err.Error()
			for _, want := range []string{tt.reason, "DNS-1123", strconv.Quote(tt.value)} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
		})
	}
}

func TestParseCacheRef(t *testing.T) {
	tests := []struct {
		in      string
		want    CacheRef
		wantErr string
	}{
		{"default/maven", CacheRef{"default", "maven"}, ""},
		{"maven", CacheRef{}, "want NAMESPACE/NAME"},
		{"default/../etc", CacheRef{}, "path separator"},
		{"default/a/b", CacheRef{}, "path separator"},
		{"/maven", CacheRef{}, "empty"},
		{"Default/maven", CacheRef{}, "upper-case"},
	}
	for _, tt := range tests {
		got, err := ParseCacheRef(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseCacheRef(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseCacheRef(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if got.String() != tt.in {
			t.Errorf("String() = %q, want %q", got.String(), tt.in)
		}
	}
}
