package v1alpha1

import (
	"testing"
	"time"
)

func TestParseMode(t *testing.T) {
	tests := []struct {
		value   string
		want    Mode
		wantErr string
	}{
		{value: "write", want: ModeWrite},
		{value: "read", want: ModeRead},
		{value: "rw", wantErr: `annotation layercache.dev/mode has value "rw": use "write" or "read"`},
		{value: "Read", wantErr: `annotation layercache.dev/mode has value "Read": use "write" or "read"`},
		{value: "", wantErr: `annotation layercache.dev/mode has value "": use "write" or "read"`},
	}
	for _, tt := range tests {
		got, err := ParseMode(tt.value)
		checkParse(t, "ParseMode", tt.value, got, err, tt.want, tt.wantErr)
	}
}

func TestParseCommitPolicy(t *testing.T) {
	const use = `use "on-success", "always", "never" or "on-marker"`
	tests := []struct {
		value   string
		want    CommitPolicy
		wantErr string
	}{
		{value: "on-success", want: CommitOnSuccess},
		{value: "always", want: CommitAlways},
		{value: "never", want: CommitNever},
		{value: "on-marker", want: CommitOnMarker},
		{value: "sometimes", wantErr: `annotation layercache.dev/commit has value "sometimes": ` + use},
		{value: " always", wantErr: `annotation layercache.dev/commit has value " always": ` + use},
		{value: "", wantErr: `annotation layercache.dev/commit has value "": ` + use},
	}
	for _, tt := range tests {
		got, err := ParseCommitPolicy(tt.value)
		checkParse(t, "ParseCommitPolicy", tt.value, got, err, tt.want, tt.wantErr)
	}
}

// checkParse checks one parse: the value it wants, or exactly the error
// text users see in an Event.
func checkParse[T ~string](t *testing.T, parse, value string, got T, err error, want T, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("%s(%q): %v", parse, value, err)
	case wantErr == "" && got != want:
		t.Errorf("%s(%q) = %q, want %q", parse, value, got, want)
	case wantErr != "" && (err == nil || err.Error() != wantErr):
		t.Errorf("%s(%q) = %q, %v; want the error %q", parse, value, got, err, wantErr)
	}
}

func TestParseClusterMaxAge(t *testing.T) {
	const use = `: use a duration of at least 0 such as "720h" (30 days), or "0s" to keep caches forever`
	tests := []struct {
		value   string
		want    time.Duration
		wantErr string
	}{
		{value: "720h", want: 720 * time.Hour},
		{value: "20s", want: 20 * time.Second},
		{value: "0s", want: 0},
		{value: "0", want: 0},
		{value: "-1h", wantErr: `clusterMaxAge has value "-1h"` + use},
		{value: "30d", wantErr: `clusterMaxAge has value "30d"` + use},
		{value: "", wantErr: `clusterMaxAge has value ""` + use},
	}
	for _, tt := range tests {
		got, err := ParseClusterMaxAge(tt.value)
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("ParseClusterMaxAge(%q) = %v, %v; want %v", tt.value, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
			t.Errorf("ParseClusterMaxAge(%q) = %v, %v; want the error %q", tt.value, got, err, tt.wantErr)
		}
	}
}
