package v1alpha1

import "fmt"

// FormatSize renders a byte count the way status.size shows it: "0B",
// "512B", "1.5GiB". The layerfs CLI prints sizes the same way, in the binary
// units that quantities such as --max-bytes 50Gi use.
func FormatSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
