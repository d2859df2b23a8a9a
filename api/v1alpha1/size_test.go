package v1alpha1

import "testing"

func TestFormatSize(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0B"},
		{1023, "1023B"},
		{1024, "1.0KiB"},
		{1536, "1.5KiB"},
		{10 << 20, "10.0MiB"},
		{1536 * 1024 * 1024, "1.5GiB"},
		{3 << 40, "3.0TiB"},
		{1 << 62, "4.0EiB"},
		{1<<63 - 1, "8.0EiB"},
	}
	for _, tt := range tests {
		if got := FormatSize(tt.in); got != tt.want {
			t.Errorf("FormatSize(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
