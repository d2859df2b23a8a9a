package v1alpha1

import (
	"slices"
	"strings"
)

// Summarized drops the entries of gone nodes and derives the summary
// fields from the rest: what the manager keeps, and what a node agent
// states with its own entry so that the manager need not write again. The
// published chain is the node agents' and is kept as it is: left out, the
// manager's status patch would delete it. LastUsed
// keeps the newest time ever seen, so a cache that every node evicted
// still says when it was last used (what cluster-wide retention reads).
func (in CacheStatus) Summarized(gone map[string]bool) CacheStatus {
	out := CacheStatus{Published: in.Published.DeepCopy(), LastUsed: in.LastUsed.DeepCopy()}
	var total int64
	var seeds []string
	for _, n := range in.Nodes {
		if gone[n.Node] {
			continue
		}
		out.Nodes = append(out.Nodes, *n.DeepCopy())
		out.Generation = max(out.Generation, n.Generation)
		total += n.SizeBytes
		if n.LastUsed != nil && (out.LastUsed == nil || n.LastUsed.After(out.LastUsed.Time)) {
			out.LastUsed = n.LastUsed.DeepCopy()
		}
		if n.SeededFrom != nil {
			seeds = append(seeds, n.SeededFrom.String())
		}
	}
	out.NodeCount = int32(len(out.Nodes))
	if len(out.Nodes) > 0 {
		out.Size = FormatSize(total)
	}
	// Nodes that seeded their copies apart (node-local classes) may have
	// started from different generations of the fallback: name each once.
	slices.Sort(seeds)
	out.SeededFrom = strings.Join(slices.Compact(seeds), ", ")
	return out
}
