package nodeagent

import (
	"testing"

	"github.com/layercache/layercache/api/v1alpha1"
)

func TestShouldCommit(t *testing.T) {
	tests := []struct {
		mode    v1alpha1.Mode
		commit  v1alpha1.CommitPolicy
		outcome string
		want    bool
	}{
		{"write", "on-success", "succeeded", true},
		{"write", "on-success", "failed", false},
		{"write", "on-success", "", false},
		{"write", "always", "succeeded", true},
		{"write", "always", "failed", true},
		{"write", "always", "", true},
		{"write", "never", "succeeded", false},
		{"write", "never", "", false},
		{"read", "always", "succeeded", false},
		{"read", "on-success", "succeeded", false},
	}
	for _, tt := range tests {
		p := provisioned{Mode: tt.mode, Commit: tt.commit, Outcome: tt.outcome}
		if got := p.shouldCommit(); got != tt.want {
			t.Errorf("mode %s, commit %s, outcome %q: shouldCommit = %v, want %v", tt.mode, tt.commit, tt.outcome, got, tt.want)
		}
	}
}

// TestDiscardWhyNamesMarkers pins the marker paths in the Discarded Event:
// users write them from the volume's root, so the Event names them so.
func TestDiscardWhyNamesMarkers(t *testing.T) {
	tests := []struct {
		marker marker
		want   string
	}{
		{markerNone, "its build did not write .layercache/commit and the commit policy is on-marker"},
		{markerAbort, "its build wrote .layercache/abort and the commit policy is on-marker"},
	}
	for _, tt := range tests {
		p := provisioned{Mode: "write", Commit: "on-marker", Marker: tt.marker}
		if got := p.discardWhy(); got != tt.want {
			t.Errorf("marker %d: discardWhy = %q, want %q", tt.marker, got, tt.want)
		}
	}
}
