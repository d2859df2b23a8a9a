package kit

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestBoundNote(t *testing.T) {
	long := "what happened: " + strings.Repeat("é", 2000) + " what to do"
	for _, tc := range []struct {
		name, in string
	}{
		{"short", "discarded volume pvc-1: its pod failed"},
		{"exactly the bound", strings.Repeat("a", maxEventNote)},
		{"long, with characters of two bytes", long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := BoundNote(tc.in)
			if len(got) > maxEventNote || !utf8.ValidString(got) {
				t.Fatalf("BoundNote gave %d bytes (valid UTF-8: %v), want at most %d", len(got), utf8.ValidString(got), maxEventNote)
			}
			if len(tc.in) <= maxEventNote && got != tc.in {
				t.Errorf("a message that fits was changed: %q", got)
			}
			if len(tc.in) > maxEventNote && (!strings.HasPrefix(got, "what happened: ") || !strings.HasSuffix(got, " what to do") || !strings.Contains(got, noteCut)) {
				t.Errorf("a long message lost its start or its end: %q", got)
			}
		})
	}
}
